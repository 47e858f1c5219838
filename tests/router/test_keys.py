"""Routing keys: which requests share a key, which source a key comes from, and the cost guard."""

from __future__ import annotations

from typing import Any

import pytest
import xxhash
from hypothesis import example, given, settings
from hypothesis import strategies as st

import templates_audit.detectors as detectors
from router import keys
from router.keys import KeyConfig, KeySource, canonical_prefix, derive, explain

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"

needs_detectors = pytest.mark.skipif(
    not hasattr(detectors, "first_volatile"),
    reason="templates_audit.detectors.first_volatile has not landed yet",
)

SYS = (
    "You are the support assistant of Acme Corp. Answer in two sentences, cite the policy "
    "section you rely on, and never reveal internal ticket notes."
)
SYS2 = SYS.replace("two sentences", "three sentences")
TOOL_A = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Find an order by its number",
        "parameters": {"type": "object", "properties": {"order": {"type": "string"}}},
    },
}
TOOL_A_REORDERED = {
    "function": {
        "parameters": {"properties": {"order": {"type": "string"}}, "type": "object"},
        "description": "Find an order by its number",
        "name": "lookup_order",
    },
    "type": "function",
}
TOOL_B = {"type": "function", "function": {"name": "refund", "parameters": {"type": "object"}}}


def sys(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def dev(text: str) -> dict[str, Any]:
    return {"role": "developer", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def asst(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def parts(*texts: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": t} for t in texts]


def chat(*messages: dict[str, Any], model: str = "qwen", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": list(messages), **extra}


def key(body: Any, path: str = CHAT, headers: dict[str, str] | None = None) -> keys.RoutingKey:
    return derive(path, headers or {}, body)


# fmt: off
# (path, body a, body b, same prefix key?) - one case per line; the id says what it proves.
SAME_OR_DIFFERENT = [
    pytest.param(CHAT, chat(sys(SYS), user("hi")), chat(sys(SYS), user("refund?")), True, id="same-system-different-user-turn-shares-key"),
    pytest.param(CHAT, chat(sys(SYS), user("a")), chat(sys(SYS), user("a"), asst("b"), user("c")), True, id="later-turns-share-key"),
    pytest.param(CHAT, chat(sys(SYS), user("x")), chat(sys(SYS2), user("x")), False, id="different-system-prompt-different-key"),
    pytest.param(CHAT, chat(sys(SYS), model="a"), chat(sys(SYS), model="b"), False, id="different-model-different-key"),
    pytest.param(CHAT, chat(sys(SYS), tools=[TOOL_A]), chat(sys(SYS), tools=[TOOL_B]), False, id="different-tools-different-key"),
    pytest.param(CHAT, chat(sys(SYS), tools=[TOOL_A]), chat(sys(SYS)), False, id="tools-vs-no-tools-different-key"),
    pytest.param(CHAT, chat(sys(SYS), tools=[TOOL_A]), chat(sys(SYS), tools=[TOOL_A_REORDERED]), True, id="tool-json-key-order-irrelevant"),
    pytest.param(CHAT, chat(sys(SYS), tools=[TOOL_A, TOOL_B]), chat(sys(SYS), tools=[TOOL_B, TOOL_A]), False, id="tool-list-order-matters-like-the-prompt"),
    pytest.param(CHAT, chat(dev(SYS), user("a")), chat(dev(SYS), user("b")), True, id="developer-role-is-a-prefix-message"),
    pytest.param(CHAT, chat(dev(SYS)), chat(sys(SYS)), False, id="role-is-part-of-the-key"),
    pytest.param(CHAT, chat(sys(SYS), dev("be terse")), chat(sys(SYS), dev("be chatty")), False, id="all-leading-system-developer-messages-count"),
    pytest.param(CHAT, chat(sys(SYS), user("a"), sys("x")), chat(sys(SYS), user("a"), sys("y")), True, id="only-leading-system-messages-count"),
    pytest.param(CHAT, chat({"role": "system", "content": parts(SYS, "tail")}), chat({"role": "system", "content": parts(SYS, "tail")}, user("q")), True, id="content-part-list-text-is-keyed"),
    pytest.param(CHAT, chat({"role": "system", "content": parts(SYS, "one")}), chat({"role": "system", "content": parts(SYS, "two")}), False, id="content-part-text-differs-key-differs"),
    pytest.param(CHAT, chat({"role": "system", "content": [*parts(SYS), {"type": "image_url", "image_url": {"url": "a.png"}}, *parts("x")]}), chat({"role": "system", "content": [*parts(SYS), {"type": "image_url", "image_url": {"url": "b.png"}}, *parts("y")]}), True, id="non-text-part-stops-the-prefix"),
    pytest.param(COMPLETIONS, {"model": "m", "prompt": SYS + " Q: one"}, {"model": "m", "prompt": SYS + " Q: two"}, False, id="completions-string-prompt-within-window-differs"),
    pytest.param(COMPLETIONS, {"model": "m", "prompt": SYS * 12 + "Q: one"}, {"model": "m", "prompt": SYS * 12 + "Q: two"}, True, id="completions-shared-leading-window-shares-key"),
    pytest.param(COMPLETIONS, {"model": "m", "prompt": [SYS * 12 + "a", "other"]}, {"model": "m", "prompt": SYS * 12 + "b"}, True, id="completions-list-of-strings-uses-first"),
    pytest.param(COMPLETIONS, {"model": "m", "prompt": [*range(300), 1]}, {"model": "m", "prompt": [*range(300), 2]}, True, id="completions-token-ids-leading-window"),
    pytest.param(COMPLETIONS, {"model": "m", "prompt": list(range(40))}, {"model": "m", "prompt": list(range(1, 41))}, False, id="completions-different-token-ids-differ"),
    pytest.param(EMBEDDINGS, {"model": "e", "input": SYS}, {"model": "e", "input": [SYS, "x"]}, True, id="embeddings-key-from-input"),
]
# fmt: on


@pytest.mark.parametrize(("path", "a", "b", "same"), SAME_OR_DIFFERENT)
def test_which_requests_share_a_prefix_key(
    path: str, a: dict[str, Any], b: dict[str, Any], same: bool
) -> None:
    ka, kb = key(a, path), key(b, path)
    assert ka.source is KeySource.PREFIX and kb.source is KeySource.PREFIX
    assert (ka.prefix == kb.prefix) is same


DAY1 = SYS + "\nToday is 2025-03-14. The user's plan is Gold."
DAY2 = SYS + "\nToday is 2025-03-15. The user's plan is Silver."
UUID1 = SYS + "\nrequest id 3f2b8c1e-9a4d-4c6e-8f1a-2b3c4d5e6f70, be nice"
UUID2 = SYS + "\nrequest id 0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d, be rude"

# fmt: off
# Volatile values: (body a, body b, the text the key must stop before) - needs the shared detectors.
VOLATILE = [
    pytest.param(chat(sys(DAY1)), chat(sys(DAY2)), "2025-03-1", id="date-in-line-2-cut-so-two-days-share-key"),
    pytest.param(chat(sys(UUID1)), chat(sys(UUID2)), "3f2b8c1e", id="uuid-cut-and-everything-after-it"),
    pytest.param(chat(sys(DAY1), dev("A")), chat(sys(DAY2), dev("B")), "2025", id="volatile-in-earlier-message-cuts-later-messages"),
    pytest.param(chat(sys(SYS), tools=[{**TOOL_B, "x": "2025-03-14T10:00:00Z"}], messages=[sys("A")]), chat(sys(SYS), tools=[{**TOOL_B, "x": "2025-03-15T11:30:00Z"}], messages=[sys("B")]), "2025", id="volatile-in-tools-cuts-messages"),
]
# fmt: on


@needs_detectors
@pytest.mark.parametrize(("a", "b", "volatile"), VOLATILE)
def test_key_stops_at_first_volatile_token(
    a: dict[str, Any], b: dict[str, Any], volatile: str
) -> None:
    ka, kb = key(a), key(b)
    assert ka.source is KeySource.PREFIX
    assert ka.prefix == kb.prefix
    text = canonical_prefix(CHAT, a)
    assert volatile not in text
    ex = explain(CHAT, a)
    assert ex is not None and ex.cut is not None
    assert ex.content_chars < ex.full_content_chars


@needs_detectors
def test_text_before_the_volatile_token_still_distinguishes_keys() -> None:
    assert key(chat(sys(DAY1))).prefix != key(chat(sys(DAY1.replace("Acme", "Apex")))).prefix


@needs_detectors
def test_volatile_cut_leaving_a_short_prefix_falls_back_to_conversation() -> None:
    body = chat(sys("Today is 2025-03-14. " + SYS), user("hello"))
    k = key(body, headers={"X-Session-ID": "s-1"})
    assert (k.source, k.conversation, k.prefix) == (KeySource.CONVERSATION, "s-1", None)


HISTORY = [sys("Be brief."), user("What is a KV cache?")]

# fmt: off
# (path, headers, body, expected source, expected conversation; ... = some derived identity)
SOURCES = [
    pytest.param(CHAT, {}, chat(sys(SYS), user("q")), KeySource.PREFIX, ..., id="long-system-prompt-is-a-prefix-key"),
    pytest.param(CHAT, {}, chat(*HISTORY), KeySource.CONVERSATION, ..., id="short-system-prompt-falls-back-to-conversation"),
    pytest.param(CHAT, {"X-Prefix-Hash": "abc123"}, chat(*HISTORY), KeySource.HEADER, ..., id="x-prefix-hash-overrides"),
    pytest.param(CHAT, {"x-PREFIX-hash": "abc123"}, None, KeySource.HEADER, None, id="override-header-case-insensitive-without-body"),
    pytest.param(CHAT, {"X-Prefix-Hash": "  "}, chat(*HISTORY), KeySource.CONVERSATION, ..., id="blank-override-is-ignored"),
    pytest.param(CHAT, {"X-Session-ID": "sess-9"}, chat(*HISTORY), KeySource.CONVERSATION, "sess-9", id="session-header-is-the-conversation"),
    pytest.param(CHAT, {"x-session-id": "sess-9"}, chat(sys(SYS)), KeySource.PREFIX, "sess-9", id="prefix-key-still-carries-conversation"),
    pytest.param(CHAT, {}, chat(*HISTORY, user="alice"), KeySource.CONVERSATION, "alice", id="body-user-is-the-conversation"),
    pytest.param(CHAT, {"X-Session-ID": "s"}, chat(*HISTORY, user="alice"), KeySource.CONVERSATION, "s", id="session-header-beats-body-user"),
    pytest.param(CHAT, {}, {"model": "qwen"}, KeySource.NONE, None, id="missing-messages-is-none-not-an-error"),
    pytest.param(CHAT, {}, chat(sys("hi")), KeySource.NONE, None, id="no-user-message-nothing-to-derive"),
    pytest.param(CHAT, {}, None, KeySource.NONE, None, id="no-json-body-is-none"),
    pytest.param(CHAT, {}, {"messages": "not a list", "tools": 5}, KeySource.NONE, None, id="ill-typed-fields-contribute-nothing"),
    pytest.param("/v1/models", {"X-Session-ID": "s"}, None, KeySource.CONVERSATION, "s", id="prompt-less-path-routes-by-session"),
    pytest.param(COMPLETIONS, {}, {"model": "m", "prompt": "short"}, KeySource.NONE, None, id="short-completion-without-identity-is-none"),
    pytest.param(COMPLETIONS, {}, {"model": "m", "prompt": "short", "user": "u"}, KeySource.CONVERSATION, "u", id="short-completion-with-user"),
    pytest.param(COMPLETIONS, {}, {"model": "m", "prompt": SYS}, KeySource.PREFIX, None, id="completions-string-prompt"),
    pytest.param(COMPLETIONS, {}, {"model": "m", "prompt": list(range(30))}, KeySource.PREFIX, None, id="completions-token-id-prompt"),
    pytest.param(CHAT + "?x=1", {}, chat(sys(SYS), user("q")), KeySource.PREFIX, ..., id="query-string-ignored"),
    pytest.param("/openai/v1/chat/completions/", {}, chat(sys(SYS), user("q")), KeySource.PREFIX, ..., id="path-suffix-match"),
]
# fmt: on


@pytest.mark.parametrize(("path", "headers", "body", "source", "conversation"), SOURCES)
def test_key_source(
    path: str, headers: dict[str, str], body: Any, source: KeySource, conversation: Any
) -> None:
    k = derive(path, headers, body)
    assert k.source is source
    if conversation is ...:
        assert k.conversation
    else:
        assert k.conversation == conversation
    assert (k.prefix is None) is (source in (KeySource.CONVERSATION, KeySource.NONE))
    if source is KeySource.HEADER:
        assert k.prefix == "abc123"


def test_chat_completions_and_embeddings_keys_never_collide() -> None:
    chat_key = key(chat(sys(SYS)))
    completion_key = key({"model": "qwen", "prompt": SYS}, COMPLETIONS)
    embedding_key = key({"model": "qwen", "input": SYS}, EMBEDDINGS)
    assert len({chat_key.prefix, completion_key.prefix, embedding_key.prefix}) == 3


def test_next_turn_resending_history_keeps_derived_conversation() -> None:
    turn1 = chat(*HISTORY)
    turn2 = chat(*HISTORY, asst("A cache of attention keys."), user("And paging?"))
    other = chat(sys("Be brief."), user("What is a B-tree?"))
    assert key(turn1).conversation == key(turn2).conversation
    assert key(turn1).conversation != key(other).conversation
    assert key(turn1).source is KeySource.CONVERSATION


def test_derived_conversation_uses_non_text_openers_and_skips_empty_ones() -> None:
    def opener(url: str) -> dict[str, Any]:
        return chat(
            sys("Be brief."),
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]},
        )

    assert key(opener("a.png")).conversation != key(opener("b.png")).conversation
    assert key(opener("a.png")).conversation == key(opener("a.png")).conversation
    assert key(chat(sys("Be brief."), user(""))).source is KeySource.NONE


def test_prefix_is_xxh3_128_of_canonical_prefix() -> None:
    body = chat(sys(SYS), user("q"), tools=[TOOL_A])
    k = key(body)
    text = canonical_prefix(CHAT, body)
    assert k.prefix == xxhash.xxh3_128_hexdigest(text.encode())
    assert k.prefix_chars == len(text)
    assert SYS in text and "lookup_order" in text and "q" not in text.split(SYS)[-1]


def test_min_prefix_chars_is_the_threshold() -> None:
    body = chat(sys("x" * 40))
    assert derive(CHAT, {}, body, KeyConfig(min_prefix_chars=64)).source is KeySource.NONE
    assert derive(CHAT, {}, body, KeyConfig(min_prefix_chars=30)).source is KeySource.PREFIX


def test_max_prefix_chars_bounds_what_is_hashed() -> None:
    cfg = KeyConfig(max_prefix_chars=500)
    a, b = chat(sys(SYS * 10 + "A")), chat(sys(SYS * 10 + "B"))
    ka, kb = derive(CHAT, {}, a, cfg), derive(CHAT, {}, b, cfg)
    assert ka.prefix == kb.prefix
    ex = explain(CHAT, a, cfg)
    assert ex is not None and ex.truncated and ex.content_chars <= 500


def test_custom_header_names_are_case_insensitive() -> None:
    cfg = KeyConfig(key_header="X-Route-Key", session_header="X-Conv")
    k = derive(CHAT, {"x-route-key": "K", "X-CONV": "c"}, chat(*HISTORY), cfg)
    assert (k.prefix, k.conversation, k.source) == ("K", "c", KeySource.HEADER)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"min_prefix_chars": -1}, id="negative-min"),
        pytest.param({"min_prefix_chars": 100, "max_prefix_chars": 50}, id="max-below-min"),
        pytest.param({"prompt_window_chars": 0}, id="empty-window"),
    ],
)
def test_key_config_rejects_nonsense(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        KeyConfig(**bad)


def test_detector_scan_is_memoised_per_text(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counting(text: str) -> None:
        calls.append(text)
        return None

    monkeypatch.setattr(keys, "_first_volatile", counting)
    monkeypatch.setattr(keys, "_cut_cache", type(keys._cut_cache)())
    prompt = SYS + " (memo test)"
    for turn in ("a", "b", "c"):
        key(chat(sys(prompt), user(turn)))
    assert len(calls) == 1
    key(chat(sys(prompt + "!"), user("a")))
    assert len(calls) == 2


def test_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "_first_volatile", lambda text: None)
    monkeypatch.setattr(keys, "_cut_cache", type(keys._cut_cache)())
    monkeypatch.setattr(keys, "_CUT_CACHE_SIZE", 8)
    for i in range(20):
        key(chat(sys(f"{SYS} variant {i}")))
    assert len(keys._cut_cache) == 8


def test_token_id_prompts_are_not_scanned_for_volatile_text() -> None:
    ids = [9876543210, 1234567890, 2025, 3, 14] * 20  # would look like numeric ids as text
    ex = explain(COMPLETIONS, {"model": "m", "prompt": ids})
    assert ex is not None and ex.cut is None
    assert ex.text.endswith(",".join(map(str, ids)))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=80),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
chat_like = st.fixed_dictionaries(
    {},
    optional={
        "model": json_values,
        "user": json_values,
        "tools": json_values,
        "prompt": json_values,
        "input": json_values,
        "messages": st.lists(
            st.fixed_dictionaries(
                # any JSON value as a role too: a list or an object is not even hashable
                {"role": st.sampled_from(["system", "developer", "user", "assistant", 3])
                 | json_values},
                optional={"content": json_values},
            )
            | json_values,
            max_size=4,
        ),
    },
)


@settings(max_examples=150, deadline=None)
@given(
    path=st.sampled_from([CHAT, COMPLETIONS, EMBEDDINGS, "/v1/models", ""]),
    body=st.one_of(st.none(), chat_like),
    headers=st.dictionaries(
        st.sampled_from(["X-Prefix-Hash", "x-session-id", "a"]), st.text(max_size=10)
    ),
)
@example(path=CHAT, body={"messages": [{"role": ["system"], "content": "S" * 80}]}, headers={})
@example(path=CHAT, body={"messages": [{"role": {"a": 1}}, {"role": "user"}]}, headers={})
def test_any_json_body_yields_a_consistent_key(
    path: str, body: Any, headers: dict[str, str]
) -> None:
    k = derive(path, headers, body, KeyConfig(min_prefix_chars=1))
    assert (k.prefix is None) is (k.source in (KeySource.CONVERSATION, KeySource.NONE))
    assert (k.conversation is None) or k.source is not KeySource.NONE
    if k.source is KeySource.PREFIX:
        text = canonical_prefix(path, body, KeyConfig(min_prefix_chars=1))
        assert k.prefix == xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


# (headers, body, expected sticky) — whether the conversation has state worth following on spill
# fmt: off
STICKY_CASES = [
    ({}, {"model": "m", "messages": [{"role": "system", "content": "S" * 100}, {"role": "user", "content": "hi"}]}, False),  # one-shot first turn: no identity, no history
    ({"X-Session-ID": "s1"}, {"model": "m", "messages": [{"role": "system", "content": "S" * 100}, {"role": "user", "content": "hi"}]}, True),  # explicit session header
    ({}, {"model": "m", "user": "u1", "messages": [{"role": "system", "content": "S" * 100}, {"role": "user", "content": "hi"}]}, True),  # explicit body user
    ({}, {"model": "m", "messages": [{"role": "system", "content": "S" * 100}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}]}, True),  # history resent: turn 2
    ({}, {"model": "m", "prompt": "P" * 200}, False),  # completions: no conversation at all
]
# fmt: on


@pytest.mark.parametrize(("headers", "body", "sticky"), STICKY_CASES)
def test_sticky_flag(headers: dict[str, str], body: dict[str, Any], sticky: bool) -> None:
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    assert derive(path, headers, body).sticky is sticky


# (path, headers, body, expected first_turn) — a chat body without assistant or tool turns
# fmt: off
FIRST_TURN_CASES = [
    ("/v1/chat/completions", {}, {"model": "m", "messages": [{"role": "system", "content": "S" * 100}, {"role": "user", "content": "hi"}]}, True),  # system + user: a first turn
    ("/v1/chat/completions", {}, {"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}]}, False),  # history: a later turn
    ("/v1/chat/completions", {}, {"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "{}"}]}, False),  # a tool turn is history too
    ("/v1/chat/completions", {"X-Prefix-Hash": "k"}, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, True),  # an override key still reports the turn
    ("/v1/chat/completions", {}, {"model": "m", "messages": []}, True),  # empty list: nothing to continue
    ("/v1/chat/completions", {}, {"model": "m", "messages": "hi"}, False),  # not a list: not a chat turn
    ("/v1/completions", {}, {"model": "m", "prompt": "P" * 200}, False),  # no messages at all
]
# fmt: on


@pytest.mark.parametrize(("path", "headers", "body", "first"), FIRST_TURN_CASES)
def test_first_turn_flag(path: str, headers: dict[str, str], body: dict[str, Any],
                         first: bool) -> None:
    assert derive(path, headers, body).first_turn is first
