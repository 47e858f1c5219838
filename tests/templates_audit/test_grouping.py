"""TemplateIndex.find_near: the answer of find, reached by masking only the changed lines."""

from __future__ import annotations

import random
import uuid

from templates_audit.findings import changed_range
from templates_audit.grouping import GUESS_CHARS, TemplateIndex

WORDS = ["billing", "shipping", "returns", "policy", "section", "customer", "Alice", "Bruno"]


def _reference(rng: random.Random, t: int) -> str:
    head = "You are support assistant of ACME Corp." if t % 3 else f"Assistant {t} here."
    rules = [f"Rule {t}.{i}: about {rng.choice(WORDS)}, cite section {i} and the {rng.choice(WORDS)}."
             for i in range(rng.randrange(3, 12))]
    tail = "Be concise." if t % 2 else f"Template {t} ends here, answer in English."
    return "\n".join([head, "Current date: 2025-05-20", *rules, "Session: 8f14e45f-ceea-467f-a0e6-"
                      "2cc4b5f6d7e1", tail]) + "\n"


def _edit(rng: random.Random, text: str) -> str:
    """Half the edits change values in place (same masks), half change the text's words or
    lines (masks differ: find decides by similarity or makes no match)."""
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    op = rng.randrange(8)
    if op < 2:  # the date
        lines[1] = f"Current date: 2025-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    elif op < 4:  # the session id
        lines[-3] = f"Session: {uuid.UUID(int=rng.getrandbits(128), version=4)}"
    elif op == 4:  # a word on a random line
        lines[i] = lines[i].replace("about", rng.choice(WORDS))
    elif op == 5:
        lines.insert(i, f"Extra line {rng.randrange(100)}.")
    elif op == 6 and len(lines) > 3:
        del lines[i]
    else:  # the date turns into a time: another mask
        lines[1] = f"Current date: {rng.randrange(24):02d}:{rng.randrange(60):02d}:00"
    return "\n".join(lines)


def test_find_near_agrees_with_find_and_gives_the_changed_lines() -> None:
    rng = random.Random(5)
    refs = [(f"m{t % 2}", _reference(rng, t)) for t in range(12)]
    near_index, full_index = TemplateIndex(), TemplateIndex()
    for t, (model, ref) in enumerate(refs):
        for index in (near_index, full_index):
            index.add(f"t{t}", model, ref, index.lookup_exact(model, ref)[1])
    hits = asked = 0
    for _ in range(3000):
        t = rng.randrange(len(refs))
        model, ref = refs[t]
        text = ref
        for _ in range(rng.randrange(1, 3)):
            text = _edit(rng, text)
        tid, key = near_index.lookup_exact(model, text)
        full_tid, full_key = full_index.lookup_exact(model, text)
        assert (tid, key) == (full_tid, full_key)
        if tid is not None:
            continue
        asked += 1
        near = near_index.find_near(model, text, key)
        expected = full_index.find(model, text, key)[0]
        if near is None:
            assert near_index.find(model, text, key)[0] == expected
            continue
        hits += 1
        assert near[0] == expected, text
        found_ref = refs[int(near[0][1:])][1]
        assert near[1] == changed_range(found_ref, text)
    assert hits > asked / 4  # the guess path was taken, not only the fallback


def test_find_near_guesses_by_first_or_last_characters_only() -> None:
    index = TemplateIndex()
    ref = "A" * GUESS_CHARS + "\nCurrent date: 2025-05-20\n" + "B" * GUESS_CHARS + "\n"
    index.add("t0", "m", ref, index.lookup_exact("m", ref)[1])
    changed = ref.replace("2025-05-20", "2025-06-01")
    assert index.find_near("m", changed, index.lookup_exact("m", changed)[1]) == (
        "t0", changed_range(ref, changed))
    other_model = index.find_near("n", changed, index.lookup_exact("n", changed)[1])
    assert other_model is None
    both_ends = "C" + changed[1:-2] + "C\n"
    assert index.find_near("m", both_ends, index.lookup_exact("m", both_ends)[1]) is None
    worded = ref.replace("Current date", "Current day")  # masks differ: not near
    assert index.find_near("m", worded, index.lookup_exact("m", worded)[1]) is None


def test_find_near_defers_to_find_once_the_masked_key_is_forgotten(monkeypatch) -> None:
    import templates_audit.grouping as grouping

    monkeypatch.setattr(grouping, "MAX_KEYS", 2)
    rng = random.Random(1)
    index = TemplateIndex()
    refs = [_reference(rng, t) for t in (1, 2, 3)]
    for t, ref in enumerate(refs):
        index.add(f"t{t}", "m", ref, index.lookup_exact("m", ref)[1])
    for t, ref in enumerate(refs):
        changed = ref.replace("2025-05-20", "2025-06-01")
        near = index.find_near("m", changed, index.lookup_exact("m", changed)[1])
        assert (near is None) == (t == 0)  # t0's masked key left the LRU map


def test_a_fixed_preamble_and_end_around_a_varying_block_is_one_template() -> None:
    head = "<|im_start|>system\nYou are ACME's assistant, answer from the context below.\n"
    rules = "\n".join(f"Rule {i}: be polite, cite the passage and never guess." for i in range(5))
    docs = ["\n".join(f"Paragraph {k} about {w} and its many details." for k in range(n))
            for n, w in ((3, "refunds"), (9, "shipping"), (5, "warranty"))]
    idx = TemplateIndex()
    ref = head + "Context:\n" + docs[0] + "\nRules:\n" + rules + "\n"
    idx.add("t0", "m", ref, 0)
    for i, d in enumerate(docs[1:], 1):
        text = head + "Context:\n" + d + "\nRules:\n" + rules + "\n"
        assert idx.find("m", text, i)[0] == "t0"
    # The same preamble before a different prompt (another product of one vendor): apart.
    other = head + "\n".join(f"Step {k}: do something else entirely, in order." for k in range(12)) + "\n"
    assert idx.find("m", other, 9)[0] is None
    # Same preamble and end, but the preamble is a single line and the passages have no line
    # structure (no key, bullet or number): apart.
    one_line = "You are ACME's assistant, answer from the context below and nothing else.\n"
    idx.add("t1", "m", one_line + docs[0] + "\nRules:\n" + rules + "\n", 10)
    assert idx.find("m", one_line + docs[1] + "\nRules:\n" + rules + "\n", 11)[0] is None


def test_remove_forgets_a_template_entirely() -> None:
    # (The auditor removes only templates of one request: none of their keys was remembered
    # for another text.)
    idx = TemplateIndex()
    multi = "You are bot A.\n" + "\n".join(f"Rule {i}: be brief about item {i}." for i in range(8))
    short = "You are talking to Alice."
    idx.add("m1", "m", multi, 1)
    idx.add("s1", "m", short, 2)
    idx.remove("m1", "m", multi, 1)
    idx.remove("s1", "m", short, 2)
    assert idx.lookup_exact("m", multi)[0] is None and idx.lookup_exact("m", short)[0] is None
    assert idx._refs == {} and idx._guess == {} and idx._postings == {} and idx._nlines == {}
    assert idx._exact == {} and idx._masked == {} and all(not d for d in idx._short.values())
    # Texts like them no longer find them by similarity either.
    assert idx.find("m", multi.replace("bot A", "bot B"), 3)[0] is None
    assert idx.find("m", short.replace("Alice", "Bob"), 4)[0] is None
