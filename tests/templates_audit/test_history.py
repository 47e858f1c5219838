"""Few-shot example turns shuffled per request (templates_audit.history)."""

from __future__ import annotations

from templates_audit.history import HistoryState, history_key
from templates_audit.tokenize import default_tokenizer

SHOTS = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
         {"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris"}]
SYSTEM = {"role": "system", "content": "Answer briefly."}


def _render(messages: list[dict[str, str]]) -> tuple[str, int]:
    """ChatML-like rendering and where its static part (the system message) ends."""
    head = f"<|im_start|>system\n{messages[0]['content']}<|im_end|>\n"
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages[1:])
    return head + body + "<|im_start|>assistant\n", len(head)


def test_history_key_needs_two_turns_before_the_last_message() -> None:
    assert history_key([SYSTEM, {"role": "user", "content": "hi"}], 1) is None
    assert history_key([SYSTEM, *SHOTS[:1], {"role": "user", "content": "hi"}], 1) is None
    key = history_key([SYSTEM, *SHOTS, {"role": "user", "content": "hi"}], 1)
    assert key is not None and len(key) == 4
    # Role is part of a message's identity; the last message is not history.
    swapped = [{"role": "assistant", "content": "2+2?"}, *SHOTS[1:]]
    assert history_key([SYSTEM, *swapped, {"role": "user", "content": "hi"}], 1) != key
    assert history_key([SYSTEM, *SHOTS, {"role": "user", "content": "other"}], 1) == key


def test_permutations_count_other_conversations_do_not() -> None:
    ref = [SYSTEM, *SHOTS, {"role": "user", "content": "q0"}]
    text, end = _render(ref)
    key = history_key(ref, 1)
    assert key is not None
    hs = HistoryState.start(key, text, end, ref, 1, default_tokenizer().encode)
    assert hs is not None
    assert hs.text.startswith("2+2?<|im_end|>") and hs.text.endswith("<|im_start|>user\n")
    assert hs.lead == "<|im_start|>user\n"
    same = [SYSTEM, *SHOTS, {"role": "user", "content": "q1"}]
    assert hs.observe(history_key(same, 1) or (), *_render(same), same, 1) is None
    shuffled = [SYSTEM, *SHOTS[2:], *SHOTS[:2], {"role": "user", "content": "q2"}]
    text2, end2 = _render(shuffled)
    hist_end = hs.observe(history_key(shuffled, 1) or (), text2, end2, shuffled, 1)
    assert hist_end is not None and text2[hist_end:].startswith("q2<|im_end|>")
    other = [SYSTEM, {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
             {"role": "user", "content": "q3"}]
    assert hs.observe(history_key(other, 1) or (), *_render(other), other, 1) is None
    assert (hs.requests, hs.reordered, len(hs.orders)) == (3, 1, 2)
    assert len(hs.examples) == 2 and hs.examples[1].startswith("Capital of France?")
