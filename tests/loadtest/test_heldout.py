"""The held-out workload: deterministic by seed, shaped as its docstring says, not a bench workload."""

from __future__ import annotations

import collections
import itertools

from loadtest.heldout import FOLLOW_GAP, markdown, requests
from loadtest.workloads import WORKLOADS
from templates_audit.tokenize import default_tokenizer


def test_shape_and_determinism() -> None:
    reqs = requests(600, seed=11, min_prompt_tokens=200, max_prompt_tokens=400)
    assert [r.json_bytes() for r in reqs] == [r.json_bytes() for r in requests(
        600, seed=11, min_prompt_tokens=200, max_prompt_tokens=400)]
    assert reqs[0].json_bytes() != requests(1, seed=12, min_prompt_tokens=200,
                                             max_prompt_tokens=400)[0].json_bytes()
    groups = collections.Counter(r.group for r in reqs)
    assert len(groups) >= 20 and set(groups) <= {f"p{i}" for i in range(24)}
    assert 0.4 <= groups["p0"] / 600 <= 0.6  # one prompt carries half the traffic
    follow = [r for r in reqs if r.turn > 0]
    assert 0.28 <= len(follow) / 600 <= 0.42  # ~35% follow-up turns
    convs = collections.defaultdict(list)
    for r in reqs:
        convs[r.conversation].append(r)
    for turns in convs.values():
        for prev, nxt in itertools.pairwise(turns):
            assert nxt.idx - prev.idx >= FOLLOW_GAP  # finished before a closed loop resends it
            assert nxt.body["messages"][: len(prev.body["messages"])] == prev.body["messages"]
    assert all("user" not in r.body for r in reqs)
    assert "heldout" not in WORKLOADS  # out of make bench and the tuned workloads


def test_long_system_prompts_by_default() -> None:
    tok = default_tokenizer()
    sizes = {len(tok.encode(r.body["messages"][0]["content"])) for r in requests(60, seed=3)}
    assert min(sizes) >= 1800 and max(sizes) <= 4500


def test_markdown() -> None:
    s = {"hit_rate": 0.9, "ttft": {"p50": 0.04, "p99": 0.5}, "load_max_over_mean": 1.2,
         "error_count": 0, "per_replica": {"a": {"prompt_tokens": 300}, "b": {"prompt_tokens": 100}}}
    md = markdown({"seed": 5, "requests": 600, "machine": {"commit": "abc1234", "nproc": 2,
                                                          "date": "2026-12-01"}, "runs": [
        {"replicas": 4, "concurrency": 16, "setups": {"router-prefix": s},
         "ceiling": {"hit_rate": 0.95}}]})
    assert md.startswith("# Held-out check\n")
    assert "--seed 5`); commit abc1234, 2026-12-01, 2 CPUs." in md
    assert "| 4 replicas, c=16 | router-prefix | 90.0% | 40 | 500 | 1.50 | 1.20 | 0 |" in md
    assert "|  | *one-cache ceiling* | 95.0% |" in md


def test_default_setups_include_the_candidate() -> None:
    from loadtest.heldout import default_setups
    from router.settings import POLICIES, RoutingSettings

    got = default_setups()
    assert got[0] == f"router-{RoutingSettings.policy}" and len(got) == len(set(got))
    assert {"router-prefix", "router-round_robin", "sglang-cache_aware"} <= set(got)
    assert ("router-cache_aware" in got) == ("cache_aware" in POLICIES)
