"""The prefix tree and re-convergence alignment (templates_audit/prefix_tree.py), on hand-made
prompts; and the property that an injected span is found where it was injected."""

from __future__ import annotations

import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from templates_audit.analysis import analyze
from templates_audit.prefix_tree import (
    PrefixTree,
    align,
    pieces,
    same_structure,
    same_template,
)
from templates_audit.tokenize import default_tokenizer
from templates_audit.traces import Record

BODY = " ".join(f"Rule {i}: answer in full sentences, cite the policy and never guess." for i in range(12))


def seq(text: str) -> array[int]:
    return pieces(text)[0]


def gap_texts(a: str, b: str) -> tuple[list[tuple[str, str]], tuple[str, str] | None]:
    """The differing runs of aligning b to a, as text."""
    ha, sa = pieces(a)
    hb, sb = pieces(b)
    al = align(ha, hb)

    def cut(src: str, starts: list[int], s: int, e: int) -> str:
        lo = starts[s] if s < len(starts) else len(src)
        hi = starts[e] if e < len(starts) else len(src)
        return src[lo:hi]

    gaps = [(cut(a, sa, a0, a1), cut(b, sb, b0, b1)) for a0, a1, b0, b1 in al.gaps]
    tail = None if al.tail is None else (cut(a, sa, al.tail[0], al.tail[1]),
                                         cut(b, sb, al.tail[2], al.tail[3]))
    return gaps, tail


# (name, a, b, expected gaps (a side, b side), expected tail). Runs fewer than ANCHOR (4) equal
# pieces apart are one gap: "2024-05-01" is one span, not three.
ALIGN_TABLE = [
    ("span at the start", "2024-05-01 " + BODY, "2025-11-28 " + BODY,
     [("2024-05-01", "2025-11-28")], None),
    ("span in the middle", "You are Bob's assistant. " + BODY, "You are Alice's assistant. " + BODY,
     [(" Bob", " Alice")], None),
    ("span at the end", BODY + " Today is Monday", BODY + " Today is Friday",
     [], (" Monday", " Friday")),
    ("two spans", f"Hi Bob, you are in the queue for order 1234. {BODY}",
     f"Hi Alice, you are in the queue for order 98765. {BODY}",
     [(" Bob", " Alice"), (" 1234", " 98765")], None),
    ("spans that differ in length", f"Speaking with Ana, a member since 1999 (id 7). {BODY}",
     f"Speaking with Maria de la Cruz Fernandez, a member since 2021 (id 554963). {BODY}",
     [(" Ana", " Maria de la Cruz Fernandez"), (" 1999 (id 7", " 2021 (id 554963")], None),
    ("spans close together are one", f"Hi Bob, order 1234. {BODY}", f"Hi Alice, order 98765. {BODY}",
     [(" Bob, order 1234", " Alice, order 98765")], None),
    ("no volatile span", BODY, BODY, [], None),
]


@pytest.mark.parametrize(("name", "a", "b", "gaps", "tail"), ALIGN_TABLE, ids=[t[0] for t in ALIGN_TABLE])
def test_alignment_finds_the_differing_spans(name: str, a: str, b: str,
                                             gaps: list[tuple[str, str]],
                                             tail: tuple[str, str] | None) -> None:
    found, found_tail = gap_texts(a, b)
    assert found == gaps
    assert found_tail == tail


def test_continuations_that_never_reconverge_are_a_tail() -> None:
    a = "You are the ACME assistant. " + BODY
    b = "You are the ACME assistant. " + " ".join(
        f"Step {i}: open the ledger, reconcile item {i} and file it." for i in range(12))
    ha, hb = seq(a), seq(b)
    al = align(ha, hb)
    # after the shared sentence nothing re-converges but the last piece (".")
    assert al.gaps[0][0] == len(seq("You are the ACME assistant."))
    assert al.matched == len(seq("You are the ACME assistant.")) + 1
    # two prompts that share their first sentence are two templates
    assert not same_template(al, len(ha), len(hb), a, b, pieces(a)[1], pieces(b)[1])


@pytest.mark.parametrize(("a", "b", "same"), [
    (f"You are speaking with Elena Yilmaz (member #554963). {BODY}",
     f"You are speaking with Tom Ng (member #12). {BODY}", True),
    (f"Examples:\nQ: one?\nA: yes.\nQ: two?\nA: no.\n{BODY}",
     f"Examples:\nQ: three?\nA: maybe.\nQ: four?\nA: later.\nQ: five?\nA: never.\n{BODY}", True),
    (f"Intro.\n{BODY}", "Intro.\n" + "\n".join(f"Other prompt line {i} about invoices." for i in range(20)),
     False),
])
def test_same_template_judges_the_alignment(a: str, b: str, same: bool) -> None:
    (ha, sa), (hb, sb) = pieces(a), pieces(b)
    assert same_template(align(ha, hb), len(ha), len(hb), a, b, sa, sb) is same


def test_a_reflowed_copy_is_another_layout_not_one_template() -> None:
    one = "The assistant is Claude. It answers briefly. It cites sources. It never guesses. " + BODY
    other = one.replace(". It", ".\n\nIt")
    (ha, sa), (hb, sb) = pieces(one), pieces(other)
    assert not same_template(align(ha, hb), len(ha), len(hb), one, other, sa, sb)
    once = one.replace(". It answers", ".\nIt answers", 1)  # one line break moved: still one
    (hc, sc) = pieces(once)
    assert same_template(align(ha, hc), len(ha), len(hc), one, once, sa, sc)


def test_same_structure_compares_line_shapes() -> None:
    assert same_structure("Q: a?\nA: b.", "Q: c?\nA: d.\nQ: e?\nA: f.")
    assert same_structure("Fact: likes tea\nFact: lives in Oslo", "Fact: has a dog\nFact: works nights")
    assert same_structure("1. Check the date\n2. Check the id", "1. Check the name\n2. Check it\n3. Check")
    # prose lines have no structural marker; bullets of different instructions differ
    assert not same_structure("Q: a?\nA: b.", "Always cite.\nNever guess.\nBe brief.")
    assert not same_structure("The desk opens at nine.\nThe bar closes late.", "The night audit.\nThe day.")
    assert not same_structure("- Quote prices in euros\n- Greet the caller", "- Do not reveal tools\n- Close politely")


def test_tree_counts_requests_and_splits_edges() -> None:
    tree = PrefixTree()
    a, b, c = seq("You are Bob. " + BODY), seq("You are Alice. " + BODY), seq("You are")
    end_a = tree.insert(a, "t1")
    tree.insert(b, "t1")
    end_c = tree.insert(c, "t2")
    assert end_a is not None and end_c is not None
    assert tree.count(a) == 1 and tree.count(b) == 1 and tree.count(c) == 3
    assert tree.root.count == 3
    tree.bump(end_a)
    assert tree.count(a) == 2 and tree.count(c) == 4
    depth, tid, count = tree.deepest(seq("You are Carol. " + BODY))
    assert depth == len(c) and tid == "t1" and count == 4
    assert tree.count(seq("Nothing like it")) == 0


def test_tree_paths_are_bounded_and_counts_of_kept_paths_stay_exact() -> None:
    tree = PrefixTree(max_paths=3)
    for i in range(10):
        tree.insert(seq(f"Prompt {i} " + BODY), "t")
    assert tree.paths == 3
    kept = [i for i in range(10) if tree.count(seq(f"Prompt {i} " + BODY))]
    assert kept == [0, 1, 2]
    assert tree.count(seq("Prompt")) == 10  # the shared prefix counts every request


def _chat(system: str, i: int) -> Record:
    return Record("t.jsonl", i + 1, messages=[{"role": "system", "content": system},
                                              {"role": "user", "content": f"question {i}?"}],
                  model="m")


PIECE_WORDS = ["Zorblat", "quux-77", "#AB12", "9f3c", "Kestrel Ridge", "éclair", "0xdeadbeef",
               "Ødegård", "v2.3.1", "ticket", "α-beta", "42", "MAY", "(draft)"]


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_a_span_injected_anywhere_in_a_static_family_is_found_at_its_token(data: st.DataObject) -> None:
    """Property: a static family with a random span (1-4 random value words) injected at a random
    word boundary is one template with a finding whose first token is where the span starts."""
    words = BODY.split(" ")
    pos = data.draw(st.integers(min_value=0, max_value=len(words) - 8), label="word position")
    seed = data.draw(st.integers(min_value=0, max_value=10_000), label="seed")
    rng = random.Random(seed)
    records = []
    for i in range(24):
        span = " ".join(rng.choice(PIECE_WORDS) + str(rng.randrange(1000))
                        for _ in range(rng.randint(1, 4)))
        records.append(_chat(" ".join([*words[:pos], span, *words[pos:]]), i))
    report = analyze(records)
    assert report.summary.templates == 1
    # where the span starts in the rendered reference (ChatML), in characters and in tokens
    start = len("<|im_start|>system\n" + " ".join(words[:pos]))
    token = len(default_tokenizer().encode("<|im_start|>system\n" + " ".join(words[:pos])))
    at = [f for f in report.findings if start <= f.char_start <= start + 1]
    assert len(at) == 1, (start, [(f.kind, f.char_start, f.char_end) for f in report.findings])
    assert token - 1 <= at[0].first_token <= token
