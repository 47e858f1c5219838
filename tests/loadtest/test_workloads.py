"""Workload generators: deterministic with a seed, and the intended sharing structure."""

from __future__ import annotations

import collections
import itertools
import json
import re
from pathlib import Path

import pytest

from loadtest.workloads import (
    CHAT,
    COMPLETIONS,
    MooncakeRecord,
    Request,
    WorkloadSpec,
    generate,
    mooncake_block_text,
    mooncake_records,
)
from templates_audit.blocks import block_hashes
from templates_audit.tokenize import default_tokenizer

TOK = default_tokenizer()


@pytest.mark.parametrize("name", ["shared-prefix", "multi-turn", "hot-prefix", "volatile", "rag",
                                  "agent"])
def test_same_seed_same_requests(name: str) -> None:
    small = {"min_prompt_tokens": 100, "max_prompt_tokens": 200, "min_history_tokens": 1500,
             "max_history_tokens": 3000}
    a = generate(WorkloadSpec(name, requests=40, seed=7, **small))
    b = generate(WorkloadSpec(name, requests=40, seed=7, **small))
    c = generate(WorkloadSpec(name, requests=40, seed=8, **small))
    assert len(a) == 40
    assert [r.json_bytes() for r in a] == [r.json_bytes() for r in b]
    assert [r.json_bytes() for r in a] != [r.json_bytes() for r in c]
    assert [r.at for r in a] == sorted(r.at for r in a)  # arrival order


def test_shared_prefix_prompt_sizes_and_zipf() -> None:
    reqs = generate(WorkloadSpec("shared-prefix", requests=400, seed=1, prompts=8))
    sizes = {len(TOK.encode(r.body["messages"][0]["content"])) for r in reqs}
    assert min(sizes) >= 900 and max(sizes) <= 4500  # 1-4k-token system prompts
    counts = collections.Counter(r.group for r in reqs)
    ranked = [n for _, n in counts.most_common()]
    assert ranked[0] > 3 * ranked[-1]  # Zipf: the top prompt dominates the tail
    # same group -> same system prompt, different user turns
    by_group = collections.defaultdict(set)
    for r in reqs:
        by_group[r.group].add(r.body["messages"][0]["content"])
    assert all(len(v) == 1 for v in by_group.values())


def test_multi_turn_resends_history_in_order() -> None:
    reqs = generate(WorkloadSpec("multi-turn", requests=60, seed=3, turns=3, min_prompt_tokens=50, max_prompt_tokens=80))
    convs = collections.defaultdict(list)
    for r in reqs:
        convs[r.conversation].append(r)
    for turns in convs.values():
        assert [t.turn for t in turns] == list(range(len(turns)))
        for prev, nxt in itertools.pairwise(turns):
            # turn k+1's messages start with all of turn k's messages (history resent)
            assert nxt.body["messages"][: len(prev.body["messages"])] == prev.body["messages"]
            assert nxt.body["user"] == prev.body["user"]


def test_hot_prefix_share() -> None:
    reqs = generate(WorkloadSpec("hot-prefix", requests=800, seed=2, turns=2, min_prompt_tokens=50, max_prompt_tokens=80))
    share = sum(1 for r in reqs if r.group == "p0") / len(reqs)
    assert 0.7 <= share <= 0.9  # one system prompt carries ~80% of the traffic


def test_volatile_injects_on_line_two() -> None:
    reqs = generate(WorkloadSpec("volatile", requests=50, seed=4, min_prompt_tokens=50, max_prompt_tokens=80))
    same_group = [r for r in reqs if r.group == reqs[0].group]
    assert len(same_group) >= 2
    lines = [r.body["messages"][0]["content"].split("\n") for r in same_group]
    assert lines[0][0] == lines[1][0]  # line 1 static
    assert lines[0][1] != lines[1][1]  # line 2 volatile
    assert lines[0][2:] == lines[1][2:]  # the rest static


def _conversations(reqs: list[Request]) -> dict[str | None, list[Request]]:
    convs: dict[str | None, list[Request]] = collections.defaultdict(list)
    for r in reqs:
        convs[r.conversation].append(r)
    return convs


def test_rag_documents_from_a_shared_pool_inside_the_user_turn() -> None:
    spec = WorkloadSpec("rag", requests=300, seed=5, prompts=3, min_prompt_tokens=100,
                        max_prompt_tokens=200, documents=200, turns=3)
    reqs = generate(spec)
    assert len(reqs) == 300 and "user" not in reqs[0].body
    per_turn = []
    first_docs = collections.Counter()
    for r in reqs:
        msgs = r.body["messages"]
        assert msgs[0]["role"] == "system" and msgs[-1]["role"] == "user"
        turn = msgs[-1]["content"]
        docs = [int(d) for d in re.findall(r"^\[\d\] Document (\d+):", turn, re.M)]
        assert 2 <= len(docs) <= 4 and len(set(docs)) == len(docs)  # 2-4 distinct documents
        assert turn.index("Document") < turn.index("Question:")  # retrieved docs, then the question
        assert all(0 <= d < 200 for d in docs)
        per_turn.append(docs)
        first_docs[(r.group, docs[0])] += 1
    used = {d for docs in per_turn for d in docs}
    assert 40 <= len(used) <= 200  # drawn from the pool of 200
    # documents are shared between requests, and so is the leading document of one app's requests
    assert collections.Counter(d for docs in per_turn for d in docs).most_common(1)[0][1] >= 15
    assert first_docs.most_common(1)[0][1] >= 5
    # a document's text is the same wherever it appears
    texts = collections.defaultdict(set)
    for r in reqs:
        for part in r.body["messages"][-1]["content"].split("\n\n[")[1:]:
            d = int(part.split("Document ", 1)[1].split(":", 1)[0])
            texts[d].add(part.split("] ", 1)[1].split("\n\nQuestion:")[0])
    assert all(len(v) == 1 for v in texts.values())
    convs = _conversations(reqs)
    assert {len(v) for v in convs.values()} == {1, 2, 3}  # 1-turns turns per conversation
    for turns in convs.values():
        assert [t.turn for t in turns] == list(range(len(turns)))
        for prev, nxt in itertools.pairwise(turns):  # a follow-up resends the history
            assert nxt.body["messages"][: len(prev.body["messages"])] == prev.body["messages"]
            assert nxt.group == prev.group


def test_agent_tool_calling_conversations_grow_to_their_target() -> None:
    from templates_audit.render import ChatRenderer

    spec = WorkloadSpec("agent", requests=120, seed=2, prompts=2, min_prompt_tokens=200,
                        max_prompt_tokens=400, min_history_tokens=8000, max_history_tokens=20000)
    reqs = generate(spec)
    assert len(reqs) == 120 and "user" not in reqs[0].body
    render = ChatRenderer().render
    convs = _conversations(reqs)
    last = sorted(convs.values(), key=lambda v: v[0].idx)[-1]  # the one the request count cuts
    for turns in convs.values():
        assert [t.turn for t in turns] == list(range(len(turns)))
        tools = turns[0].body["tools"]
        assert 6 <= len(tools) <= 12 and all(t["type"] == "function" for t in tools)
        names = {t["function"]["name"] for t in tools}
        for prev, nxt in itertools.pairwise(turns):
            pm, nm = prev.body["messages"], nxt.body["messages"]
            assert nm[: len(pm)] == pm and len(nm) == len(pm) + 2 and nxt.body["tools"] == tools
            call, result = nm[-2], nm[-1]
            assert call["role"] == "assistant" and call["content"] is None
            (tc,) = call["tool_calls"]
            assert tc["function"]["name"] in names and json.loads(tc["function"]["arguments"])
            assert result == {"role": "tool", "tool_call_id": tc["id"],
                              "content": result["content"]}
        if turns is not last:
            final = len(TOK.encode(render(turns[-1].body["messages"], tools)))
            assert 8000 <= final <= 22000, final  # the history grew to 8-20k tokens
    assert len(convs) >= 5


def test_mooncake_block_text_is_exactly_one_block() -> None:
    for hid in (0, 1, 12345, 999999):
        text = mooncake_block_text(hid)
        assert len(TOK.encode(text)) == 512
        assert text.endswith("\n")
    assert mooncake_block_text(5) == mooncake_block_text(5)
    assert mooncake_block_text(5) != mooncake_block_text(6)


def test_mooncake_replay_keeps_lengths_and_sharing(tmp_path: object) -> None:
    trace = f"{tmp_path}/t.jsonl"
    recs = [
        {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
        {"timestamp": 500, "input_length": 700, "output_length": 500, "hash_ids": [0, 3]},
        {"timestamp": 1500, "input_length": 300, "output_length": 5, "hash_ids": [9]},
    ]
    with open(trace, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in recs)
    reqs = generate(WorkloadSpec("mooncake", requests=10, trace_path=trace, time_scale=2.0, max_output_tokens=64))
    assert len(reqs) == 3
    ids = [TOK.encode(r.body["prompt"]) for r in reqs]
    assert [len(x) for x in ids] == [1100, 700, 300]
    h0, h1 = block_hashes(ids[0], 16), block_hashes(ids[1], 16)
    shared = sum(1 for a, b in zip(h0, h1, strict=False) if a == b)
    assert shared == 512 // 16  # exactly the shared 512-token block 0
    assert [r.at for r in reqs] == [0.0, 0.25, 0.75]  # time scaled by 2
    assert reqs[1].body["max_tokens"] == 64  # output length capped


# (line, what the error says) — a bad record names its line and what is wrong with it
BAD_MOONCAKE = [
    ("nope", "Expecting value"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"timestamp": "x", "input_length": 5, "output_length": 1, "hash_ids": [1]}', "timestamp"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "timestamp"),
    ('{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": [1]}', "input_length"),
    ('{"timestamp": 1, "input_length": 5, "output_length": -1, "hash_ids": [1]}', "output_length"),
    ('{"timestamp": 1, "input_length": 5.5, "output_length": 1, "hash_ids": [1]}', "input_length"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": []}', "hash_ids"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1, "a"]}', "hash_ids"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 1}', "hash_ids"),
]


@pytest.mark.parametrize(("line", "says"), BAD_MOONCAKE)
def test_a_bad_mooncake_line_is_named_with_its_number(tmp_path: Path, line: str,
                                                      says: str) -> None:
    good = '{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}'
    trace = tmp_path / "t.jsonl"
    trace.write_text(f"{good}\n\n{good}\n{line}\n{good}\n")
    with pytest.raises(ValueError, match=rf"t\.jsonl:4: .*{says}"):
        list(mooncake_records(str(trace)))
    with pytest.raises(ValueError, match=r"t\.jsonl:4: "):   # the replay reads through it too
        generate(WorkloadSpec("mooncake", requests=10, trace_path=str(trace)))


def test_mooncake_records_of_a_good_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 2.5, "input_length": 13, "output_length": 0, "hash_ids": [7]}\n'
                     "\n")
    assert list(mooncake_records(str(trace))) == [MooncakeRecord(2.5, 13, 0, (7,))]


def test_unknown_workload_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        generate(WorkloadSpec("no-such-workload"))


def test_a_file_of_bodies_and_its_bad_lines(tmp_path: Path) -> None:
    f = tmp_path / "bodies.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n\n'
                 '{"path": "/v1/completions", "body": {"prompt": "p"}, "at": 0.5}\n'
                 '{"prompt": "q"}\n')
    reqs = generate(WorkloadSpec(str(f), requests=10, rate=5.0))
    assert [(r.path, r.at) for r in reqs[1:]] == [(COMPLETIONS, 0.5), (COMPLETIONS, reqs[2].at)]
    assert reqs[0].path == CHAT and reqs[0].body["messages"][0]["content"] == "hi"
    assert len(generate(WorkloadSpec(str(f), requests=2, rate=5.0))) == 2  # blank lines skipped
    for line, says in (("[1]", "expected a JSON object, got list"), ('{"body": 3}', "body"),
                       ('{"path": 5, "prompt": "p"}', "path"), ('{"at": "x", "prompt": "p"}', "at"),
                       ("{", "Expecting property name")):
        f.write_text('{"prompt": "ok"}\n' + line + "\n")
        with pytest.raises(ValueError, match=rf"bodies\.jsonl:2: .*{says}"):
            generate(WorkloadSpec(str(f), requests=10, rate=5.0))
