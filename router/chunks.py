"""Request -> chained chunk hashes over the whole prompt, for the prefix index. Pure, no I/O.

The index (`router.prefix_index`) asks which replica holds the longest prefix of *this*
request, so the hashes cover everything vLLM would put in the KV cache, in order, in a
canonical form:

- a seed: the API kind and the model (the same text on two models is not a shared prefix);
- chat: the tool definitions (JSON, sorted keys) as one chunk, then every message in order:
  its role, its content (a string, or the content parts: text as text, other parts - images,
  audio - as canonical JSON so that the same image hashes the same) and any other field
  (``name``, ``tool_calls``, ``tool_call_id``) as canonical JSON;
- completions: the prompt string, or a token-id prompt (ids joined by commas).

Chunk boundaries: every message ends a chunk, and a message (or a raw prompt) longer than
``chunk_chars`` is cut into pieces of ``chunk_chars`` from its start. A conversation's turn N+1
resends turn N's messages unchanged, so it shares *every* chunk of turn N; a prompt that
extends a previous prompt shares all of its full pieces. Hashes are chained (``xxh3_64`` of the
piece, seeded with the previous hash), so equal hash ``k`` means equal content up to chunk ``k``.

Each chunk carries the estimated prompt tokens up to its end: characters / ``chars_per_token``
plus a few tokens of chat-template markup per message. No tokenizer runs here; the estimate only
has to rank replicas and weigh cache against load.

At most `MAX_CHUNKS` chunks are hashed; a longer request is indexed by its first part only
(its prompt-token estimate still covers the whole request).

Cost: one UTF-8 encode and one xxh3 pass over the prompt text (GB/s), O(messages) Python work.
Malformed bodies never raise: a field of the wrong type contributes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import xxhash

from router.keys import api_kind

__all__ = ["MAX_CHUNKS", "MESSAGE_TOKENS", "NO_CHUNKS", "Chunks", "request_chunks"]

MAX_CHUNKS = 1024
MESSAGE_TOKENS = 4  # role header and end marker of one message in a chat template
_ROLE = "\x1f"
_END = "\x1e"


class Chunks(NamedTuple):
    hashes: tuple[int, ...]  # chained; hashes[k] identifies the prompt up to the end of chunk k
    tokens: tuple[int, ...]  # estimated prompt tokens up to the end of chunk k (increasing)
    total: int  # estimated prompt tokens of the whole request
    # the request's exact block keys (hashes of full blocks, tokens = block ends, total = the
    # prompt's tokens) when precise routing computed them (`router.kv_events`); else None
    exact: Chunks | None = None


NO_CHUNKS = Chunks((), (), 0)


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                text = part.get("text")
                parts.append(text if isinstance(text, str) else "")
            else:
                parts.append(_dumps(part))
        return "\n".join(parts)
    return "" if content is None else _dumps(content)


def _message_text(message: Any) -> str:
    if type(message) is not dict and not isinstance(message, Mapping):
        return _dumps(message)
    role = message.get("role")
    text = f"{role if isinstance(role, str) else ''}{_ROLE}{_content_text(message.get('content'))}"
    if len(message) > 2 or "content" not in message:
        rest = {k: v for k, v in message.items() if k != "role" and k != "content"}
        if rest:
            text += _ROLE + _dumps(rest)
    return text + _END


class _Builder:
    __slots__ = ("chars", "chars_per_token", "chunk_chars", "extra", "h", "hashes", "tokens")

    def __init__(self, seed: str, chunk_chars: int, chars_per_token: float) -> None:
        self.h = xxhash.xxh3_64_intdigest(seed.encode("utf-8", "surrogatepass"))
        self.chunk_chars = chunk_chars
        self.chars_per_token = chars_per_token
        self.hashes: list[int] = []
        self.tokens: list[int] = []
        self.chars = 0
        self.extra = 0

    def add(self, text: str, extra_tokens: int = 0) -> None:
        """One unit (a message, a prompt): `add_units` of one."""
        self.add_units(((text, extra_tokens),))

    def add_messages(self, messages: list[Any]) -> None:
        """Every chat message as one unit of its `_message_text` with `MESSAGE_TOKENS` of
        markup."""
        self.add_units((_message_text(m), MESSAGE_TOKENS) for m in messages)

    def add_units(self, units: Iterable[tuple[str, int]]) -> None:
        """Units of (text, markup tokens) in order: each cut into pieces of chunk_chars, the
        last ending the unit; one call for all of them, the running state kept in locals."""
        size, per, hashes, tokens = self.chunk_chars, self.chars_per_token, self.hashes, self.tokens
        h, chars, extra = self.h, self.chars, self.extra
        hash_ = xxhash.xxh3_64_intdigest
        for text, extra_tokens in units:
            extra += extra_tokens
            n = len(text)
            start = 0
            while True:
                if len(hashes) >= MAX_CHUNKS:
                    chars += n - start
                    break
                piece = text[start:start + size]
                h = hash_(piece.encode("utf-8", "surrogatepass"), seed=h)
                chars += len(piece)
                hashes.append(h)
                tokens.append(int(chars / per) + extra)  # `estimate`, inlined: once per chunk
                start += size
                if start >= n:
                    break
        self.h, self.chars, self.extra = h, chars, extra

    def estimate(self) -> int:
        return int(self.chars / self.chars_per_token) + self.extra

    def done(self) -> Chunks:
        return Chunks(tuple(self.hashes), tuple(self.tokens), self.estimate())


def request_chunks(path: str, body: Mapping[str, Any] | None, chunk_chars: int = 1024,
                   chars_per_token: float = 4.0) -> Chunks:
    """The chained chunks of one request body (no chunks for paths without a prompt)."""
    if type(body) is not dict and not isinstance(body, Mapping):  # a dict: the cheap test
        return NO_CHUNKS
    kind = api_kind(path)
    model = body.get("model")
    model = model if isinstance(model, str) else ""
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return NO_CHUNKS
        b = _Builder(f"chat{_ROLE}{model}", chunk_chars, chars_per_token)
        tools = body.get("tools")
        if tools:
            b.add("tools" + _ROLE + _dumps(tools) + _END)
        b.add_messages(messages)
        return b.done()
    if kind == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            # token ids: chunk_chars / chars_per_token ids per chunk, one token each
            b = _Builder(f"ids{_ROLE}{model}", chunk_chars, 1.0)
            step = max(1, int(chunk_chars / chars_per_token))
            for i in range(0, len(prompt), step):
                if len(b.hashes) >= MAX_CHUNKS:
                    b.chars += len(prompt) - i
                    break
                ids = prompt[i:i + step]
                b.h = xxhash.xxh3_64_intdigest(",".join(map(str, ids)).encode(), seed=b.h)
                b.chars += len(ids)
                b.hashes.append(b.h)
                b.tokens.append(b.estimate())
            return b.done()
        if not isinstance(prompt, str) or not prompt:
            return NO_CHUNKS
        b = _Builder(f"completions{_ROLE}{model}", chunk_chars, chars_per_token)
        b.add(prompt)
        return b.done()
    return NO_CHUNKS
