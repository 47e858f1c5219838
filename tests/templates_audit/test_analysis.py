"""analysis: grouping into templates, findings (kind, role, cost), hit rates, bounded state."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest

from templates_audit import state
from templates_audit.analysis import Auditor, analyze
from templates_audit.blocks import PrefixCache, block_hashes
from templates_audit.findings import Span, diff_spans
from templates_audit.model import Report
from templates_audit.render import ChatRenderer
from templates_audit.replay import Head, Replay
from templates_audit.tokenize import default_tokenizer
from templates_audit.traces import Record

BODY = "\n".join(f"Rule {i}: answer questions about topic number {i} carefully and politely."
                 for i in range(30))
NAMES = ["Alice", "Bruno", "Chiara", "Dmitri"]
USERS = ["How do I sort a list?", "What is TCP?", "Write a haiku.", "Explain DNS."]


def chat(system: str | None, user: str, i: int = 0, role: str = "system",
         tools: list[dict[str, object]] | None = None,
         history: list[dict[str, str]] | None = None) -> Record:
    msgs = [] if system is None else [{"role": role, "content": system}]
    msgs += history or []
    msgs.append({"role": "user", "content": user})
    return Record("t", i + 1, messages=msgs, tools=tools)


def many(make: Callable[[int], Record], n: int = 12) -> list[Record]:
    return [make(i) for i in range(n)]


def tool(desc: str) -> list[dict[str, object]]:
    return [{"type": "function", "function": {"name": "now", "description": desc,
                                              "parameters": {"type": "object"}}}]


def shuffled_tools(i: int) -> list[dict[str, object]]:
    tools = [{"type": "function", "function": {"name": f"tool_{k}", "description": f"Does {k}.",
                                               "parameters": {"type": "object"}}}
             for k in range(6)]
    random.Random(i).shuffle(tools)
    return tools


SHOTS = ["Q: 2+2?\nA: 4", "Q: capital of France?\nA: Paris", "Q: opposite of hot?\nA: cold"]


def shuffled(i: int) -> str:
    order = list(itertools.permutations(SHOTS))[i % 6]
    return "Examples:\n" + "\n".join(order) + "\n" + BODY


def shot_turns(i: int) -> list[dict[str, str]]:
    """Three example question/answer pairs as chat turns, in the i-th order."""
    pairs = [(q, a) for q, a in (shot.split("\n") for shot in SHOTS)]
    order = list(itertools.permutations(pairs))[i % 6]
    return [{"role": r, "content": c} for q, a in order for r, c in (("user", q), ("assistant", a))]


SCENARIOS: list[tuple[str, Callable[[int], Record], int, list[tuple[str, str]]]] = [
    # (name, request i -> record, templates, [(kind, role) of findings in token order])
    # same system prompt, different user turns: one template, nothing to fix
    ("identical", lambda i: chat("You are helpful.\n" + BODY, USERS[i % 4], i), 1, []),
    # two unrelated system prompts: two templates, nothing to fix
    ("unrelated", lambda i: chat(["You are a pirate.\n" + BODY, "Reply in French only."][i % 2],
                                 USERS[i % 4], i), 2, []),
    # a date near the top: one date finding in the system message
    ("date", lambda i: chat(f"Current date: 2024-05-{i + 1:02d}\n" + BODY, "hi", i), 1,
     [("date", "system")]),
    # a date on line 1 and a user name on line 30: both reported, in order
    ("date+name", lambda i: chat(f"Current date: 2024-05-{i % 5 + 1:02d}\n{BODY}\n"
                                 f"The user's name is {NAMES[i % 4]}.\nBe brief.", "hi", i), 1,
     [("date", "system"), ("name", "system")]),
    # a value that never varies (knowledge cutoff) is not a finding
    ("constant", lambda i: chat("Knowledge cutoff: 2023-10\n" + BODY, USERS[i % 4], i), 1, []),
    # a per-request uuid
    ("uuid", lambda i: chat(f"Session 123e4567-e89b-12d3-a456-4266141740{i:02d}\n" + BODY, "x", i),
     1, [("uuid", "system")]),
    # an API key that changes per tenant: a secret (also a security finding)
    ("secret", lambda i: chat(f"Use key sk-proj-{'ab' * 12}{i:04d}Zq9 for tools.\n" + BODY, "x", i),
     1, [("secret", "system")]),
    # few-shot examples shuffled per request
    ("reordered", lambda i: chat(shuffled(i), "x", i), 1, [("reordered_block", "system")]),
    # trailing/double spaces that vary
    ("whitespace", lambda i: chat("Be helpful." + " " * (i % 3 + 1) + "Be kind.\n" + BODY, "x", i),
     1, [("whitespace", "system")]),
    # a short prompt with a name no detector knows: still one template
    ("short-name", lambda i: chat(f"You are talking to {NAMES[i % 4]}. Be warm and helpful, "
                                  "and always answer in full sentences.", "hi", i), 1,
     [("name", "system")]),
    # short prompts that differ in prose, not a value: two templates
    ("short-prose", lambda i: chat(["You are a helpful assistant.", "You are a pirate."][i % 2],
                                   "hi", i), 2, []),
    # a timestamp inside a tool description
    ("tools", lambda i: chat("You are helpful.\n" + BODY, "x", i,
                             tools=tool(f"Now is 2024-05-20T10:{i:02d}:00Z. Returns the time."
                                        " Use it whenever the user asks about time or dates.")),
     1, [("timestamp", "tools")]),
    # the tool list sent in another order per request (any permutation, fixed points too)
    ("tools-shuffled", lambda i: chat("You are helpful.\n" + BODY, "x", i,
                                      tools=shuffled_tools(i)), 1, [("reordered_block", "tools")]),
    # the developer role is attributed as such
    ("developer", lambda i: chat(f"Today is 2024-06-{i + 1:02d}.\n" + BODY, "x", i,
                                 role="developer"), 1, [("date", "developer")]),
    # varying conversation history is expected variation
    ("history", lambda i: chat("You are helpful.\n" + BODY, "next", i,
                               history=[{"role": "user", "content": f"q{i}"},
                                        {"role": "assistant", "content": f"a{i}"}]), 1, []),
    # few-shot examples sent as chat turns, shuffled per request: a user-role finding
    ("few-shot-turns", lambda i: chat("You are helpful.\n" + BODY, USERS[i % 4], i,
                                      history=shot_turns(i)), 1, [("reordered_block", "user")]),
    # the same example turns in a fixed order: nothing to fix
    ("few-shot-fixed", lambda i: chat("You are helpful.\n" + BODY, USERS[i % 4], i,
                                      history=shot_turns(0)), 1, []),
    # a completions prompt with a varying date in the middle
    ("prompt-date", lambda i: Record("t", i + 1, prompt=f"Date: 2024-05-{i + 1:02d}\n{BODY}\n"
                                                         f"Question: {USERS[i % 4]}"), 1,
     [("date", "prompt")]),
    # a completions prompt whose only varying part is its tail: expected variation
    ("prompt-tail", lambda i: Record("t", i + 1, prompt=f"{BODY}\nQuestion: {USERS[i % 4]} {i}"),
     1, []),
]


@pytest.mark.parametrize(("name", "make", "templates", "expected"), SCENARIOS,
                         ids=[s[0] for s in SCENARIOS])
def test_scenarios(name: str, make: Callable[[int], Record], templates: int,
                   expected: list[tuple[str, str]]) -> None:
    report = analyze(many(make))
    assert report.summary.templates == templates
    assert [(f.kind, f.role.value) for f in report.findings] == expected


PARAGRAPHS = [
    "Refunds are accepted within thirty days of delivery for every plan sold online.",
    "Shipping inside the country takes five working days; express takes two.",
    "Our support team answers e-mails within one business day, weekends excluded.",
    "Warranty claims need the original receipt and the serial number of the device.",
    "Gift cards never expire and can be used in every store and on the website.",
    "Orders above fifty euros ship for free; smaller ones pay a flat fee.",
]


def retrieved(i: int, rules: bool = True) -> str:
    """A RAG system prompt: a fixed preamble, three retrieved paragraphs, then fixed rules."""
    docs = [PARAGRAPHS[(i * 5 + k * 7) % 6] for k in range(1 + i % 3)]
    head = "You are ACME's assistant. Answer from the context below.\nCite the passage you use.\n"
    return head + "\nContext:\n" + "\n\n".join(docs) + ("\n\nRules:\n" + BODY if rules else "")


def test_retrieved_documents_are_one_block_finding() -> None:
    report = analyze(many(lambda i: chat(retrieved(i), USERS[i % 4], i), 24))
    assert report.summary.templates == 1
    [f] = report.findings
    [t] = report.templates
    assert (f.kind, f.role.value) == ("other", "system")
    assert t.shared_prefix_tokens == f.first_token < 40  # right after "Context:"
    assert f.requests_affected <= 24 and f.distinct_values <= 24
    # The rules after the documents are the cost: every full block of them.
    assert t.static_tokens - f.first_token - 160 <= f.tokens_lost_per_request
    assert report.summary.achievable_hit_rate > report.summary.observed_hit_rate + 0.15


def test_a_varying_end_is_shared_prefix_but_no_gain() -> None:
    # A completions prompt whose end varies: no finding, the shared prefix stops at the
    # variation, and the achievable hit rate is the observed one (nothing to move).
    report = analyze(many(lambda i: Record("t", i + 1, prompt=f"{BODY}\nQuestion: {USERS[i % 4]} {i}")))
    [t] = report.templates
    assert report.findings == ()
    assert t.shared_prefix_tokens < t.static_tokens
    assert report.summary.achievable_hit_rate == report.summary.observed_hit_rate


def test_shuffled_example_turns_finding_and_achievable_rate() -> None:
    def make(order: Callable[[int], list[dict[str, str]]]) -> list[Record]:
        return many(lambda i: chat("You are helpful.\n" + BODY, f"{USERS[i % 4]} {i}", i,
                                   history=order(i)), 18)

    shuffled = analyze(make(shot_turns))
    [f] = shuffled.findings
    assert (f.requests_affected, f.distinct_values) == (18, 6)
    assert f.first_token == shuffled.templates[0].static_tokens  # right after the static part
    assert f.tokens_lost_per_request > 0 and "fixed order" in f.suggestion
    assert f.examples[0].startswith("Q: 2+2?")
    # Achievable = the trace with every request's examples in the first request's order.
    fixed = analyze(make(lambda i: shot_turns(0)))
    assert shuffled.summary.achievable_hit_rate == fixed.summary.observed_hit_rate
    assert shuffled.summary.observed_hit_rate < fixed.summary.observed_hit_rate


def test_shuffled_tools_cost_the_tools_too() -> None:
    # Every full block from the shuffled tool list's block to the end of the static part is lost:
    # a fixed order makes the tool list itself cacheable (the achievable replay counts it so).
    report = analyze(many(lambda i: chat("You are helpful.\n" + BODY, "x", i,
                                         tools=shuffled_tools(i))))
    [f] = report.findings
    [t] = report.templates
    assert (f.kind, f.role.value) == ("reordered_block", "tools")
    assert f.tokens_lost_per_request == (t.static_tokens // 16 - f.block) * 16
    assert f.suggestion.startswith("send the tools in one fixed order")
    assert f"the {int(f.tokens_lost_per_request):,} static tokens from it on" in f.suggestion


def test_spans_of_one_request_in_one_block_count_once() -> None:
    tpl = state.TemplateState(id="t", static_text="a b c d e f", static_ids=[], offsets=[0],
                              head=Head([]), ach_head=Head([]), roles=(), tools_json="",
                              is_chat=False)
    tpl.observe([Span(0, 5, 0, 5, "other", True)], "x y z")
    tpl.observe([Span(0, 1, 0, 1, "other", True), Span(2, 3, 2, 3, "other", True),
                 Span(5, 5, 6, 7, "other", True)], "p q r s")
    [st] = tpl.spans  # overlapping spans and an insertion at its edge: one span
    assert st.differed == 2
    assert len(st.values) == 3  # the reference's value and one per request
    assert "p … q … s" in st.examples


def test_spans_that_grow_into_each_other_are_one_span() -> None:
    tpl = state.TemplateState(id="t", static_text="aaaa bbbb cccc dddd", static_ids=[],
                              offsets=[0], head=Head([]), ach_head=Head([]), roles=(),
                              tools_json="", is_chat=False, requests=4)
    tpl.observe([Span(0, 4, 0, 1, "other", True)], "x")
    tpl.observe([Span(10, 14, 0, 1, "other", True)], "y")  # apart from the first: a 2nd span
    tpl.observe([Span(3, 11, 0, 1, "other", True)], "z")  # grows the first over the second
    assert len(tpl.spans) == 2
    [st] = tpl.merged_spans()
    assert (st.ref_start, st.ref_end, st.differed) == (0, 14, 3)
    assert st.examples[:2] == ["aaaa", "x"] and "y" in st.examples


def test_examples_picked_per_request_are_one_finding() -> None:
    # 2-5 of 20 examples picked per request (in the pool's order): the examples block is one
    # finding, however the line diffs of single requests cut it (with this seed, one request's
    # diff was a deletion and an insertion one line apart, first seen as a second span).
    pool = [f"Example {k}: Q: how do I reset widget {k}? A: hold the button for {k} seconds."
            for k in range(20)]
    rng = random.Random(4)
    picks = [sorted(rng.sample(range(20), rng.randint(2, 5))) for _ in range(200)]

    def make(i: int) -> Record:
        return chat("Examples:\n" + "\n".join(pool[k] for k in picks[i]) + "\n" + BODY, "x", i)

    report = analyze(many(make, 200))
    [f] = report.findings
    differ = sum(p != picks[0] for p in picks)  # the first request is the reference
    # drawn from a pool of 20 lines: a sampled block (issue 19), fixed by one set and order
    assert (f.kind, f.role.value, f.requests_affected) == ("sampled_block", "system", differ)
    assert f.suggestion.startswith("fix the set and order of examples")


def test_finding_counts_cost_and_location() -> None:
    report = analyze(many(lambda i: chat(f"Current date: 2024-05-{i % 4 + 1:02d}\n" + BODY, "x", i)))
    [f] = report.findings
    [t] = report.templates
    assert (f.requests_affected, f.distinct_values) == (12, 4)
    assert set(f.examples) == {"2024-05-01", "2024-05-02", "2024-05-03", "2024-05-04"}
    assert f.block == f.first_token // 16 and t.shared_prefix_tokens == f.first_token
    # Every full block after the date's block, up to the end of the static part, is lost.
    assert f.tokens_lost_per_request % 16 == 0
    assert t.static_tokens - 48 <= f.tokens_lost_per_request <= t.static_tokens
    assert "Current date: …" in f.suggestion and f"{int(f.tokens_lost_per_request):,}" in f.suggestion


def test_hit_rates_match_the_shared_block_math() -> None:
    records = many(lambda i: chat("You are helpful.\n" + BODY, USERS[i % 4], i), 8)
    report = analyze(records)
    # Recompute with the project's one block implementation, request by request.
    renderer, tok, cache = ChatRenderer(), default_tokenizer(), PrefixCache(None, 16)
    hits = queries = 0
    for r in records:
        ids = tok.encode(renderer.render(r.messages or []))
        hits += cache.insert(block_hashes(ids, 16), len(ids))
        queries += len(ids)
    assert report.summary.observed_hit_rate == pytest.approx(hits / queries)
    assert report.summary.achievable_hit_rate == pytest.approx(hits / queries)


def test_achievable_exceeds_observed_when_a_value_breaks_the_prefix() -> None:
    s = analyze(many(lambda i: chat(f"Now: 2024-05-20 10:{i:02d}\n" + BODY, "x", i))).summary
    assert s.observed_hit_rate < 0.2 < 0.8 < s.achievable_hit_rate


def test_finding_ids_are_stable_across_runs() -> None:
    def make(i: int) -> Record:
        return chat(f"Current date: 2024-05-{i + 1:02d}\n" + BODY, "x", i)

    def ids(r: Report) -> list[str]:
        return [f.id for f in r.findings]

    assert ids(analyze(many(make))) == ids(analyze(many(make)))


def test_redaction_keeps_shape_only() -> None:
    report = analyze(many(lambda i: chat(f"Current date: 2024-05-{i + 1:02d}\n{BODY}\n"
                                         f"The user's name is {NAMES[i % 4]}.\nBe brief.", "x", i)),
                     redact_values=True)
    date, name = report.findings
    assert set(date.examples) == {"####-##-##"}
    assert all(e.endswith("***") and len(e) == 4 for e in name.examples)


def test_state_is_bounded_by_templates_not_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "MAX_DISTINCT", 10)
    auditor = Auditor(cache_blocks=64)
    for i in range(300):
        auditor.add(chat(f"Request id 7{i:06d}42 at 2024-05-20T10:{i % 60:02d}:00Z\n" + BODY, "x", i))
    [tpl] = auditor.templates.values()
    assert len(tpl.spans) <= 2
    assert all(len(st.values) <= 10 and len(st.examples) <= state.MAX_EXAMPLES for st in tpl.spans)
    [*findings] = auditor.report().findings
    assert findings and all(f.distinct_values_capped for f in findings)


def test_single_request_templates_beyond_the_bound_are_dropped() -> None:
    """A trace of unique prompts keeps at most max_templates; what is dropped (single-request
    templates only) changes neither the hit rates nor the findings, and a dropped prompt that
    comes back is a new template."""
    records = []
    for i in range(60):
        if i % 3 == 0:  # one busy template with a finding
            records.append(chat(f"Current date: 2024-05-{i % 7 + 1:02d}\n" + BODY, "x", i))
        else:  # unique prompts, short and multi-line
            # (prose words: prompts that differ only in their numbers are one skeleton)
            rng = random.Random(i)
            words = "alpha bravo delta river stone cloud maple ember quartz lunar velvet orbit".split()
            # (and no shared scaffolding: prompts that re-converge between their words are one
            # template with volatile words)
            lines = "\n".join(" ".join(rng.sample(words, 6)).capitalize() + "."
                              for k in range(i % 6))
            records.append(chat(f"{' '.join(rng.sample(words, 4)).capitalize()}.\n{lines}", "x", i))
    records += [records[1], records[2]]  # two early unique prompts come back
    bounded, unbounded = Auditor(max_templates=5), Auditor(max_templates=None)
    bounded.add_all(records)
    unbounded.add_all(records)
    b, u = bounded.report(), unbounded.report()
    assert len(bounded.templates) <= 5 and len(b.templates) <= 5
    assert b.summary.templates == len(b.templates) + b.summary.templates_dropped
    assert b.summary.templates_dropped >= 35 and u.summary.templates_dropped == 0
    assert (b.summary.observed_hit_rate, b.summary.achievable_hit_rate) == (
        u.summary.observed_hit_rate, u.summary.achievable_hit_rate)
    assert [(f.kind, f.requests_affected) for f in b.findings] == [
        (f.kind, f.requests_affected) for f in u.findings] == [("date", 20)]
    # Nothing of the dropped templates is left in the index.
    assert set(bounded.index._refs) == set(bounded.templates)
    assert all(set(post) <= set(bounded.templates) for post in bounded.index._postings.values())


def test_template_render_errors_become_bad_lines() -> None:
    renderer = ChatRenderer("{{ raise_exception('no system role') }}")
    report = analyze([chat("S", "U")], renderer=renderer)
    assert report.summary.requests == 0 and report.summary.bad_lines == 1
    assert "no system role" in report.bad_line_samples[0].error


REPLAY_CASES = [
    # (pool blocks, exact) — a replay of random requests must equal inserting every block
    (None, False),  # unbounded pool: the lazy head shortcut is exact
    (64, True),  # small LRU pool, exact mode: every block inserted, heads age like in vLLM
    (24, True),  # pool barely above two requests: constant eviction, still exact
]


@pytest.mark.parametrize(("num_blocks", "exact"), REPLAY_CASES)
def test_replay_equals_inserting_every_block(num_blocks: int | None, exact: bool) -> None:
    rng = random.Random(num_blocks or 0)
    naive, fast = PrefixCache(num_blocks, 4), Replay(PrefixCache(num_blocks, 4), exact=exact)
    head_ids = [list(range(h * 1000, h * 1000 + 40 + h)) for h in range(4)]
    heads = [Head(block_hashes(ids, 4)) for ids in head_ids]
    for _ in range(600):
        h = rng.randrange(4)
        ids = head_ids[h] + [rng.randrange(30) for _ in range(rng.randrange(0, 12))]
        hashes = block_hashes(ids, 4)
        k = len(heads[h].hashes)
        assert fast.serve(heads[h], k, hashes[k:], len(ids)) == naive.insert(hashes, len(ids))


def test_lazy_replay_of_a_bounded_pool_stays_close_with_busy_heads() -> None:
    # Heads reused constantly (the case the shortcut is for): the lazy LRU refresh agrees.
    rng = random.Random(5)
    naive, fast = PrefixCache(512, 4), Replay(PrefixCache(512, 4))
    head_ids = [list(range(h * 1000, h * 1000 + 40)) for h in range(3)]
    heads = [Head(block_hashes(ids, 4)) for ids in head_ids]
    expected = got = 0
    for _ in range(3000):
        h = rng.randrange(3)
        ids = head_ids[h] + [rng.randrange(10**6) for _ in range(rng.randrange(1, 20))]
        hashes = block_hashes(ids, 4)
        expected += naive.insert(hashes, len(ids))
        got += fast.serve(heads[h], 10, hashes[10:], len(ids))
    assert got == expected


SPANS = [
    # (reference static text, request static text, [(ref value, request value, kind)])
    ("Date: 2024-05-20\nx", "Date: 2024-05-21\nx", [("2024-05-20", "2024-05-21", "date")]),  # fragment widened to the value
    ("Now 08:32PM Monday, May 13, 2024.\nx", "Now 11:05AM Tuesday, May 14, 2024.\nx",
     [("08:32PM Monday, May 13, 2024", "11:05AM Tuesday, May 14, 2024", "timestamp")]),  # one detected value, many words
    ("Hi Alice. Today is Thursday, 24 April 2025 in Paris.", "Hi Bob. Today is Friday, 25 April 2025 in Rome.",
     [("Alice", "Bob", "name"), ("Thursday, 24 April 2025", "Friday, 25 April 2025", "date"),
      ("Paris", "Rome", "other")]),  # three values on one line stay three spans
    ("a\nQ: 1\nQ: 2\nb", "a\nQ: 2\nQ: 1\nb", [("Q: 1\nQ: 2", "Q: 2\nQ: 1", "reordered_block")]),  # shuffled lines
    # two lines swapped across lines that stayed in place: one reordered block, not word diffs
    ("a\nQ: 1\nx\ny\nQ: 2\nb", "a\nQ: 2\nx\ny\nQ: 1\nb",
     [("Q: 1\nx\ny\nQ: 2", "Q: 2\nx\ny\nQ: 1", "reordered_block")]),
    # ... but two unrelated changes far apart stay two values
    ("a\nQ: 1\nx\ny\nQ: 2\nb", "a\nQ: 3\nx\ny\nQ: 4\nb",
     [("1", "3", "other"), ("2", "4", "other")]),
    ("a  b\nc", "a b\nc", [(" ", "", "whitespace")]),  # whitespace only
    ("head\nend", "head\nmail 1\nmail 2\nend", [("", "mail 1\nmail 2", "other")]),  # injected lines
    ("same\ntext", "same\ntext", []),  # identical: nothing
    # a rewritten sentence is one span, not a word diff
    ("Context: the cat sat on the mat and purred all day long\nend",
     "Context: a dog ran in the park and barked at every bird\nend",
     [("the cat sat on the mat and purred all day long",
       "a dog ran in the park and barked at every bird", "other")]),
    # rewritten paragraphs (retrieved documents) are one block, with or without a new paragraph
    ("Docs:\nRefunds take thirty days for every plan we sell online.\n\nShipping takes five "
     "working days within the country.\nend",
     "Docs:\nOur support team answers within one business day by email.\n\nWarranty claims "
     "need the original receipt and the serial number.\nend",
     [("Refunds take thirty days for every plan we sell online.\n\nShipping takes five working"
       " days within the country", "Our support team answers within one business day by email."
       "\n\nWarranty claims need the original receipt and the serial number", "other")]),
    ("Docs:\nRefunds take thirty days for every plan we sell online.\n\nShipping takes five "
     "working days within the country.\nend",
     "Docs:\nOur support team answers within one business day by email.\n\nWarranty claims "
     "need the original receipt.\n\nGift cards never expire and work in any store.\nend",
     [("Refunds take thirty days for every plan we sell online.\n\nShipping takes five working"
       " days within the country.", "Our support team answers within one business day by email."
       "\n\nWarranty claims need the original receipt.\n\nGift cards never expire and work in "
       "any store.", "other")]),
]


@pytest.mark.parametrize(("ref", "req", "expected"), SPANS)
def test_diff_spans(ref: str, req: str, expected: list[tuple[str, str, str]]) -> None:
    got = [(ref[s.ref_start:s.ref_end], req[s.start:s.end], s.kind) for s in diff_spans(ref, req)]
    assert got == expected


def test_spliced_static_tokens_equal_a_fresh_tokenisation() -> None:
    """A new static part of a known template reuses the reference's tokens around the lines
    that differ (analysis._splice_ids); the result must be exactly encode()'s."""
    from templates_audit.analysis import _splice_ids
    from templates_audit.findings import changed_range

    tok = default_tokenizer()
    rng = random.Random(11)
    pool = ["Rule 1: be brief.", "Current date: 2024-05-20", "", "  indented  line", "<|im_start|>",
            "You are talking to Alice.", "x", "Request time: 12:34:56Z", "tabs\tand  spaces ",
            "über naïve 日本", "[INST] hi [/INST]", "internationalization_of_things"]
    for _ in range(400):
        lines = [rng.choice(pool) for _ in range(rng.randrange(0, 8))]
        ref = "\n".join(lines) + "\n" if lines or rng.random() < 0.5 else ""
        auditor = Auditor()
        auditor.add(Record("t", 1, prompt=ref))
        (tpl,) = auditor.templates.values()
        edited = list(lines)
        for _ in range(rng.randrange(1, 4)):
            op = rng.randrange(3)
            i = rng.randrange(len(edited) + 1)
            if op == 0:
                edited.insert(i, rng.choice(pool))
            elif edited and i < len(edited):
                if op == 1:
                    del edited[i]
                else:
                    edited[i] = edited[i][: rng.randrange(len(edited[i]) + 1)] + rng.choice(pool)
        text = "\n".join(edited) + "\n"
        got, same_to, same_from = _splice_ids(tok, tpl, text, changed_range(tpl.static_text, text))
        assert got == tok.encode(text), (ref, text)
        assert got[:same_to] == tpl.static_ids[:same_to]
        assert got[same_from:] == tpl.static_ids[len(tpl.static_ids) - len(got) + same_from:]


@pytest.mark.parametrize("step_blocks", [0, 1, 4])
def test_shared_blocks_is_the_longest_equal_block_prefix(step_blocks: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from templates_audit import analysis

    monkeypatch.setattr(analysis, "_STEP_BLOCKS", step_blocks)
    rng = random.Random(step_blocks)
    for _ in range(2000):
        bs = rng.choice([1, 2, 4])
        ref = [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        cut = rng.randrange(len(ref) + 1)
        ids = ref[:cut] + [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        limit = rng.randrange(len(ref) // bs + 1)
        equal = next((i for i, (a, b) in enumerate(zip(ids, ref, strict=False)) if a != b), min(len(ids), len(ref)))
        expected = 0
        while (expected < min(limit, len(ids) // bs)
               and ids[expected * bs:(expected + 1) * bs] == ref[expected * bs:(expected + 1) * bs]):
            expected += 1
        assert analysis._shared_blocks(ids, ref, limit, bs, rng.randrange(equal + 1)) == expected


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_static_part_hashes_equal_a_fresh_chain(block_size: int) -> None:
    """A new static part's block hashes (shared head, spliced tokens, the reference's block
    token hashes re-chained after an edit that keeps the token count) equal block_hashes of its
    tokens."""
    tok = default_tokenizer()
    rng = random.Random(block_size)
    lines = [f"Rule {i}: answer about topic {i % 7} in plain words." for i in range(40)]
    auditor = Auditor(block_size=block_size)
    for n in range(300):
        edited = list(lines)
        for _ in range(rng.randrange(1, 3)):
            i = rng.randrange(len(edited))
            if rng.random() < 0.7:  # a value of the same shape: the token count is kept
                edited[i] = f"Request time: 2025-05-20T{rng.randrange(24):02d}:{rng.randrange(60):02d}Z"
            else:
                edited[i] = edited[i] + " and more" * rng.randrange(3)
        auditor.add(Record("t", n, messages=[{"role": "system", "content": "\n".join(edited)},
                                             {"role": "user", "content": f"q{n}"}]))
    entries = list(auditor._static_lru.values())
    assert len(entries) > 100
    for entry in entries:
        assert entry.ids == tok.encode(entry.text)
        assert entry.head.hashes == block_hashes(entry.ids, block_size)
