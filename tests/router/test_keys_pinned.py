"""Pinned routing keys and chunk hashes: the exact values the router produced at 916f386.

Routing keys are public interface (clients compute `X-Prefix-Hash` with `router.client.hash_key`,
nginx places keys on its ring, several router processes and versions must agree), and the chunk
hashes place new conversations on the ring (`routing._novel_key`). Any rewrite of `router.keys`
or `router.chunks` for speed must reproduce these byte for byte. One case per line: the
request shapes the derivation distinguishes (system/developer text, content parts up to a
non-text part, tools, history, a volatile cut, `user`, session and override headers, a
non-dict Mapping body, ill-typed fields, completions text / token ids / batches, embeddings,
a path without a prompt, no body).
"""

from __future__ import annotations

import random
from types import MappingProxyType
from typing import Any

import pytest

from router.chunks import request_chunks
from router.keys import KeyConfig, derive

SYSTEM = "You are the ACME help desk assistant.\n" + " ".join(
    random.Random(7).choice(["alpha", "beta", "gamma", "delta", "päivää", "数据"]) for _ in range(260))
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CASES = [
    ("chat_system_user", "/v1/chat/completions", {}, {"model": "m", "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "How do I reset?"}]}),
    ("chat_tools_history", "/v1/chat/completions", {}, {"model": "m", "tools": TOOLS, "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12C"}]}),
    ("chat_parts_image", "/v1/chat/completions", {}, {"model": "m", "messages": [
        {"role": "developer", "content": [{"type": "text", "text": SYSTEM}, {"type": "text", "text": "more"}]},
        {"role": "system", "content": [{"type": "text", "text": "x" * 80},
                                       {"type": "image_url", "image_url": {"url": "data:a"}}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:b"}}]}]}),
    ("chat_volatile", "/v1/chat/completions", {}, {"model": "m", "messages": [
        {"role": "system", "content": SYSTEM[:400] + " Today is 2026-12-02T01:02:03Z. " + SYSTEM[400:]},
        {"role": "user", "content": "hi"}]}),
    ("chat_short_user_field", "/v1/chat/completions", {}, {"model": "m", "user": "u-42",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}),
    ("chat_session_header", "/v1/chat/completions", {"X-Session-ID": " s-1 "}, {"model": "m",
        "messages": [{"role": "user", "content": "hi"}]}),
    ("chat_override_header", "/v1/chat/completions", {"x-prefix-hash": "abc"}, {"model": "m",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}),
    ("chat_mapping_proxy", "/v1/chat/completions/", {}, MappingProxyType({"model": "m", "messages": [
        MappingProxyType({"role": "system", "content": SYSTEM}),
        MappingProxyType({"role": "user", "content": "q"}),
        MappingProxyType({"role": "assistant", "content": "a"})]})),
    ("chat_odd_roles", "/v1/chat/completions", {}, {"model": 3, "messages": [
        {"role": ["system"], "content": SYSTEM}, "junk", {"role": "user", "content": ""}]}),
    ("completions_text", "/v1/completions?x=1", {}, {"model": "m", "prompt": SYSTEM * 2}),
    ("completions_ids", "/v1/completions", {}, {"model": "m", "prompt": list(range(700))}),
    ("completions_batch", "/v1/completions", {}, {"model": "m", "prompt": [SYSTEM, "other"]}),
    ("embeddings", "/v1/embeddings", {}, {"model": "e", "input": SYSTEM}),
    ("other_path", "/v1/models", {}, {"model": "m"}),
    ("no_body", "/v1/chat/completions", {}, None),
]

EXPECTED: dict[str, dict[str, Any]] = {
    'chat_system_user': {"key": ["9ba97bda457296c09127b2d11bb16c89", "c-e638fa707453e8cdebf348d86aa5483b", "prefix", 1612, False], "chunks": [[3487204417450532156, 10413925598132306165, 15447927200140777246], [260, 405, 414], 414]},
    'chat_tools_history': {"key": ["f7fc1c6c3161c07c810f0661ee91fd6d", "c-c9591c56142b0ae5a3d00fea8a5eb6ac", "prefix", 1765, True], "chunks": [[5147436169672710736, 12876154739233365365, 5457955261663672312, 8379144712496918400, 15361175361500907064, 638078937107574637], [38, 298, 443, 453, 488, 500], 500]},
    'chat_parts_image': {"key": ["e7d637c7e6c0cd2035f607612ce0e36d", "c-aa67872218eaa10ba3586060f337fcdb", "prefix", 1707, False], "chunks": [[6504247757462805312, 14643699415442913460, 13235154989984024637, 11584111275020536727], [260, 407, 445, 463], 463]},
    'chat_volatile': {"key": ["a361e74609d2d29870f304b6c3a99ca2", "c-f9430619c8e11c0b5c85370d4f979832", "prefix", 424, False], "chunks": [[2033245135853783714, 15979870773512625216, 3807288168248256149], [260, 413, 419], 419]},
    'chat_short_user_field': {"key": [None, "u-42", "conversation", 0, True], "chunks": [[12014919788936241513, 10595182267579694192], [8, 14], 14]},
    'chat_session_header': {"key": [None, "s-1", "conversation", 0, True], "chunks": [[4258096173931558356], [6], 6]},
    'chat_override_header': {"key": ["abc", "c-f9430619c8e11c0b5c85370d4f979832", "header", 0, False], "chunks": [[3487204417450532156, 10413925598132306165, 1292982628343244932], [260, 405, 411], 411]},
    'chat_mapping_proxy': {"key": ["9ba97bda457296c09127b2d11bb16c89", "c-9ecc0f001a3e8d0b061b3e795e649010", "prefix", 1612, True], "chunks": [[3487204417450532156, 10413925598132306165, 11605806072881728633, 7610629542703219815], [260, 405, 411, 418], 418]},
    'chat_odd_roles': {"key": [None, None, "none", 0, False], "chunks": [[7233875777356356373, 10015305489240537325, 2737461437818485438, 11574601688907562731], [260, 403, 409, 414], 414]},
    'completions_text': {"key": ["40e1bb1631f682c2fa2d078944255ae1", None, "prefix", 1038, False], "chunks": [[6419098770954202419, 11892786608133988964, 5396835009014085432, 17465080177858595756], [256, 512, 768, 798], 798]},
    'completions_ids': {"key": ["1235f56895f8f1fd7543a1d4917dcb61", None, "prefix", 927, False], "chunks": [[9020949383446922220, 2092280884754649956, 11614985074286129816], [256, 512, 700], 700]},
    'completions_batch': {"key": ["40e1bb1631f682c2fa2d078944255ae1", None, "prefix", 1038, False], "chunks": [[], [], 0]},
    'embeddings': {"key": ["a99811b676e4645c2a0c1f8ef92b998b", None, "prefix", 1037, False], "chunks": [[], [], 0]},
    'other_path': {"key": [None, None, "none", 0, False], "chunks": [[], [], 0]},
    'no_body': {"key": [None, None, "none", 0, False], "chunks": None},
}


@pytest.mark.parametrize(("name", "path", "headers", "body"), CASES, ids=[c[0] for c in CASES])
def test_key_is_pinned(name: str, path: str, headers: dict[str, str], body: Any) -> None:
    k = derive(path, headers, body, KeyConfig())
    assert [k.prefix, k.conversation, k.source.value, k.prefix_chars, k.sticky] == \
        EXPECTED[name]["key"]


@pytest.mark.parametrize(("name", "path", "headers", "body"), CASES, ids=[c[0] for c in CASES])
def test_chunks_are_pinned(name: str, path: str, headers: dict[str, str], body: Any) -> None:
    if body is None:
        return
    c = request_chunks(path, body, 1024, 4.0)
    assert [list(c.hashes), list(c.tokens), c.total] == EXPECTED[name]["chunks"]
