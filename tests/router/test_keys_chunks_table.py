"""A pinned table over generated bodies: `keys.derive` and `chunks.request_chunks` give exactly
what they gave before their walks over the messages were merged and inlined (issue #18).

The bodies cover every branch the walks take: leading system/developer messages with string,
text-part, mixed and malformed content, tools, history turns (assistant/tool), openers of every
content type, ``user``, session and override headers, non-mapping messages, non-string roles,
completions and embeddings prompts (strings, batches, token ids). The digest is of the repr of
every (key, chunks) pair; regenerate it only for an intended change of the derivation."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from router.chunks import request_chunks
from router.keys import KeyConfig, derive

PINNED = "86009a7e344d274b0ff973206128a25bb4bff3a8ef785ae536119728e6c7d45c"

_TEXTS = ["", "hi", "You are a helpful assistant. " * 4, "x" * 1500, "ts 2024-05-01T10:00:00Z ok",
          "id 123e4567-e89b-12d3-a456-426614174000 then more text " * 3, "é ü 中文 " * 20]


def _content(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.45:
        return rng.choice(_TEXTS)
    if r < 0.6:
        return [{"type": "text", "text": rng.choice(_TEXTS)} for _ in range(rng.randint(0, 3))]
    if r < 0.7:
        return [{"type": "text", "text": rng.choice(_TEXTS)},
                {"type": "image_url", "image_url": {"url": "data:x"}}]
    if r < 0.75:
        return [{"type": "text", "text": 5}]
    if r < 0.8:
        return None
    if r < 0.85:
        return {"weird": True}
    return rng.choice(_TEXTS) * 2


def _message(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.05:
        return "not a message"
    role = rng.choice(["system", "system", "developer", "user", "user", "assistant", "tool",
                       None, ["system"], 3])
    m: dict[str, Any] = {"role": role, "content": _content(rng)}
    if rng.random() < 0.1:
        m["name"] = "bob"
    if rng.random() < 0.05:
        del m["content"]
    if role == "assistant" and rng.random() < 0.3:
        m["tool_calls"] = [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]
    return m


def _body(rng: random.Random) -> tuple[str, dict[str, str], Any]:
    kind = rng.choice(["chat", "chat", "chat", "completions", "embeddings", "other"])
    headers: dict[str, str] = {}
    if rng.random() < 0.15:
        headers["x-session-id"] = rng.choice(["s1", " s2 ", ""])
    if rng.random() < 0.1:
        headers[rng.choice(["x-prefix-hash", "X-Prefix-Hash"])] = "override"
    body: dict[str, Any] = {}
    if rng.random() < 0.9:
        body["model"] = rng.choice(["m", "other", 7])
    if rng.random() < 0.15:
        body["user"] = rng.choice(["u1", "", 5])
    if rng.random() < 0.5:
        body["stream"] = True
    if kind == "chat":
        path = "/v1/chat/completions"
        if rng.random() < 0.2:
            body["tools"] = [{"type": "function", "function": {"name": "f", "b": 1, "a": [2]}}]
        if rng.random() < 0.95:
            body["messages"] = [_message(rng) for _ in range(rng.randint(0, 6))]
        else:
            body["messages"] = "nope"
    elif kind in ("completions", "embeddings"):
        path = f"/v1/{kind}"
        field = "prompt" if kind == "completions" else "input"
        r = rng.random()
        body[field] = (rng.choice(_TEXTS) * rng.randint(1, 4) if r < 0.4 else
                       [rng.randint(0, 50000) for _ in range(rng.randint(0, 700))] if r < 0.7
                       else [rng.choice(_TEXTS), "b"] if r < 0.85 else [[1, 2, 3]] if r < 0.9
                       else 5)
        if kind == "completions" and rng.random() < 0.1:
            body["messages"] = [_message(rng) for _ in range(2)]
    else:
        path = "/v1/models"
    return path, headers, body


def _table() -> str:
    rng = random.Random(18)
    configs = [KeyConfig(), KeyConfig(min_prefix_chars=1), KeyConfig(max_prefix_chars=100)]
    out = hashlib.sha256()
    for i in range(3000):
        path, headers, body = _body(rng)
        cfg = configs[i % 3]
        key = derive(path, headers, body, cfg)
        chunks = request_chunks(path, body, 256 if i % 2 else 1024, 4.0)
        out.update(repr((key, chunks)).encode("utf-8", "surrogatepass"))
    return out.hexdigest()


def test_derive_and_request_chunks_match_the_pinned_table() -> None:
    assert _table() == PINNED
