"""router.chunks: whole-request chained chunks, boundaries at messages."""

from __future__ import annotations

from typing import Any

from router.chunks import MAX_CHUNKS, MESSAGE_TOKENS, request_chunks

CHAT = "/v1/chat/completions"


def _turns(n: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "S" * 3000}]
    for i in range(n):
        msgs.append({"role": "user", "content": f"question {i}"})
        msgs.append({"role": "assistant", "content": f"answer {i} " * 50})
    return msgs


def test_next_turn_shares_every_chunk_of_the_previous_one() -> None:
    turn1 = request_chunks(CHAT, {"model": "m", "messages": _turns(1)[:-1]})
    turn3 = request_chunks(CHAT, {"model": "m", "messages": _turns(3)[:-1]})
    assert turn3.hashes[:len(turn1.hashes)] == turn1.hashes
    assert len(turn3.hashes) > len(turn1.hashes)
    # a 3000-char system message in 1024-char pieces: 3 chunks, then one per short message
    assert len(turn1.hashes) == 3 + 1


def test_tokens_are_cumulative_estimates() -> None:
    c = request_chunks(CHAT, {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]})
    assert c.tokens == (c.total,)
    assert c.total == (len("user\x1f") + 400 + 1) // 4 + MESSAGE_TOKENS
    assert list(c.tokens) == sorted(c.tokens)


def test_model_tools_and_message_fields_are_part_of_the_prefix() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    other_model = {**base, "model": "n"}
    with_tools = {**base, "tools": [{"type": "function", "function": {"name": "f"}}]}
    named = {"model": "m", "messages": [{"role": "user", "content": "hello", "name": "bob"}]}
    hashes = {request_chunks(CHAT, b).hashes[-1] for b in (base, other_model, with_tools, named)}
    assert len(hashes) == 4


def test_completions_prompts_share_their_full_pieces() -> None:
    a = request_chunks("/v1/completions", {"model": "m", "prompt": "p" * 2500})
    b = request_chunks("/v1/completions", {"model": "m", "prompt": "p" * 2500 + "more"})
    assert a.hashes[:2] == b.hashes[:2] and a.hashes[2] != b.hashes[2]
    ids = request_chunks("/v1/completions", {"model": "m", "prompt": list(range(600))})
    assert len(ids.hashes) == 3 and ids.total == 600


def test_bad_bodies_give_no_chunks_and_long_ones_are_capped() -> None:
    for body in (None, {}, {"messages": "x"}, {"prompt": 3}):
        assert request_chunks(CHAT if "messages" in (body or {}) else "/v1/completions",
                              body).hashes == ()
    assert request_chunks("/v1/embeddings", {"input": "x"}).total == 0
    odd = request_chunks(CHAT, {"messages": [3, {"role": ["x"]}, {"content": {"a": 1}}]})
    assert len(odd.hashes) == 3
    huge = request_chunks("/v1/completions", {"prompt": "z" * (1024 * (MAX_CHUNKS + 10))})
    assert len(huge.hashes) == MAX_CHUNKS and huge.total == 1024 * (MAX_CHUNKS + 10) // 4
