"""The discrete-event simulator: router policy + replica engine in virtual time."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from loadtest.simulate import SimConfig, SimRequest, mooncake_requests, simulate, workload_requests
from templates_audit.blocks import PrefixCache, block_hashes


def _prompt(group: int, tail: int, n_static: int = 160, n_tail: int = 20) -> list[int]:
    return [group * 100_000 + i for i in range(n_static)] + [tail * 7 + 1_000_000 + j for j in range(n_tail)]


def _reqs(n: int, groups: int, spacing: float) -> list[SimRequest]:
    rng = random.Random(n * 31 + groups)
    out = []
    for i in range(n):
        g = rng.randrange(groups)
        body = {"model": "m", "messages": [{"role": "system", "content": f"group {g} " + "static text " * 20},
                                           {"role": "user", "content": f"q{i}"}]}
        out.append(SimRequest(at=i * spacing, path="/v1/chat/completions", key_body=body,
                              prompt_ids=_prompt(g, i), max_tokens=4))
    return out


def _trace_requests(recs: list[dict[str, Any]], tmp: Path,
                    max_output_tokens: int) -> list[SimRequest]:
    """Requests of a synthetic Mooncake trace (``recs`` written to ``tmp``/trace.jsonl)."""
    path = tmp / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return list(mooncake_requests(str(path), None, 1.0, max_output_tokens, 1, 16))


def test_hits_match_the_block_pool_projection_on_one_replica() -> None:
    reqs = _reqs(40, 5, spacing=50.0)  # far apart: each request runs alone
    res = simulate(reqs, SimConfig(replicas=1, kv_blocks=None, block_size=16))
    cache = PrefixCache(None, 16)
    for r in reqs:
        cache.insert(block_hashes(r.prompt_ids, 16), len(r.prompt_ids))
    assert res.hit_rate == pytest.approx(cache.hits / cache.queries)
    assert res.requests == 40 and res.ttft["count"] == 40
    # one replica, one request at a time: the simulation is its own one-cache ceiling
    assert res.ceiling["hit_rate"] == pytest.approx(res.hit_rate) and res.of_ceiling == 1.0


def test_deterministic() -> None:
    reqs = _reqs(60, 6, spacing=0.01)
    a = simulate(reqs, SimConfig(replicas=3, kv_blocks=200))
    b = simulate(reqs, SimConfig(replicas=3, kv_blocks=200))
    assert a.per_replica_requests == b.per_replica_requests
    assert a.hit_rate == b.hit_rate and a.ttft == b.ttft


def test_prefix_policy_beats_round_robin_when_the_cache_is_tight() -> None:
    # 12 prefixes of 10 blocks; each replica holds 40 blocks: only prefix affinity keeps them warm
    reqs = _reqs(240, 12, spacing=0.05)
    prefix = simulate(reqs, SimConfig(replicas=4, policy="prefix", kv_blocks=40))
    rr = simulate(reqs, SimConfig(replicas=4, policy="round_robin", kv_blocks=40))
    assert prefix.hit_rate > 1.5 * rr.hit_rate
    assert set(prefix.branches) <= {"home", "spill", "fallback"}


def test_mooncake_hashes_are_memoised_correctly(tmp_path: object) -> None:
    trace = f"{tmp_path}/t.jsonl"
    recs = [
        {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
        {"timestamp": 100, "input_length": 700, "output_length": 900, "hash_ids": [0, 3]},
    ]
    with open(trace, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in recs)
    reqs = list(mooncake_requests(trace, max_output_tokens=32))
    assert [len(r.prompt_ids) for r in reqs] == [1100, 700]
    for r in reqs:
        assert list(r.prompt_hashes or []) == block_hashes(r.prompt_ids, 16)
    assert reqs[0].prompt_hashes[:32] == reqs[1].prompt_hashes[:32]  # shared block 0
    assert reqs[0].prompt_hashes[32] != reqs[1].prompt_hashes[32]
    assert reqs[1].max_tokens == 32 and reqs[1].at == pytest.approx(0.1)
    res = simulate(reqs, SimConfig(replicas=2))
    assert res.requests == 2


def test_named_workload_runs_through_the_real_key_derivation() -> None:
    reqs = workload_requests("multi-turn", 40, seed=1, rate=50.0, turns=4,
                             min_prompt_tokens=100, max_prompt_tokens=200)
    res = simulate(reqs, SimConfig(replicas=2, policy="prefix"))
    assert res.requests == 40
    assert sum(res.per_replica_requests.values()) == 40
    assert res.hit_rate > 0.3  # turns resend history and system prompts repeat


def _conversation_records(turns: int, convs: int, first_id: int, first_turn_blocks: int,
                          output_length: int, gap: Callable[[], int]) -> list[dict[str, Any]]:
    """Mooncake records of `convs` conversations sharing system block 0, turn by turn: turn k
    of a conversation resends its history plus one block (`first_turn_blocks` + k blocks after
    the system one); consecutive records `gap()` ms apart."""
    recs = []
    t = 0
    for turn in range(turns):
        for conv in range(convs):
            hids = [0] + [first_id + conv * 10 + j for j in range(turn + first_turn_blocks)]
            recs.append({"timestamp": t, "input_length": 512 * len(hids),
                         "output_length": output_length, "hash_ids": hids})
            t += gap()
    return recs


def test_cache_aware_keeps_completions_conversations_together_under_spill(
        tmp_path: object) -> None:
    """Mooncake-style conversations sharing one system block: every record has the same key,
    so under load the hash-only prefix policy spills them anywhere; cache_aware sends each
    continuation to the replica holding its history."""
    rng = random.Random(5)
    recs = _conversation_records(turns=4, convs=30, first_id=1000, first_turn_blocks=1,
                                 output_length=8, gap=lambda: rng.randrange(5, 15))
    reqs = _trace_requests(recs, Path(str(tmp_path)), max_output_tokens=8)
    cfg = dict(replicas=4, kv_blocks=1200, load_floor=0)
    ca = simulate(reqs, SimConfig(**cfg, policy="cache_aware", routing={"cache_load_floor": 0}))
    prefix = simulate(reqs, SimConfig(**cfg, policy="prefix"))
    assert prefix.branches.get("spill", 0) > 0      # the shared key did spill
    assert ca.branches.get("cache_hit", 0) > 0      # continuations followed their history
    assert ca.hit_rate > prefix.hit_rate + 0.05, (ca.hit_rate, prefix.hit_rate)


def test_cache_aware_spreads_new_conversations_at_low_load(tmp_path: object) -> None:
    """Below the load floor the prefix policy runs every conversation of the shared system
    block on the key's home, where their histories evict each other; cache_aware places each
    new conversation by its own first chunk and uses the whole fleet's caches."""
    # the shared block is a quarter of a first turn: under routing.match_threshold (0.3)
    recs = _conversation_records(turns=3, convs=40, first_id=5000, first_turn_blocks=3,
                                 output_length=4, gap=lambda: 400)   # one request at a time
    reqs = _trace_requests(recs, Path(str(tmp_path)), max_output_tokens=4)
    ca = simulate(reqs, SimConfig(replicas=4, kv_blocks=1500, policy="cache_aware"))
    prefix = simulate(reqs, SimConfig(replicas=4, kv_blocks=1500, policy="prefix"))
    assert prefix.load_max_over_mean == pytest.approx(4.0)   # everything on one replica
    assert ca.load_max_over_mean < 2.0
    assert ca.hit_rate > prefix.hit_rate + 0.1, (ca.hit_rate, prefix.hit_rate)


def test_a_bad_trace_line_is_a_usage_error_naming_it(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from loadtest.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0]}\n'
                     '{"timestamp": 1, "input_length": 600, "output_length": 4, "hash_ids": 3}\n')
    assert main(["simulate", "--trace", str(trace), "--replicas", "2"]) == 2
    err = capsys.readouterr().err
    assert "t.jsonl:2: hash_ids: expected a non-empty list" in err and "Traceback" not in err
    assert main(["simulate", "--trace", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read trace" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["rag", "agent"])
def test_rag_and_agent_run_through_the_simulation(name: str) -> None:
    reqs = workload_requests(name, 40, 0, 20.0, prompts=2, min_prompt_tokens=100,
                             max_prompt_tokens=200, min_history_tokens=1500,
                             max_history_tokens=3000, min_doc_tokens=50, max_doc_tokens=150)
    assert name != "agent" or all(r.key_body["tools"] for r in reqs)
    res = simulate(reqs, SimConfig(replicas=4, kv_blocks=400))
    assert res.requests == 40 and res.ttft["count"] == 40 and res.rejected == 0
    assert 0 < res.hit_rate and 0 < res.ceiling["hit_rate"] < 1
    assert res.ceiling["num_blocks"] == 1600


def test_a_request_longer_than_a_replica_is_rejected_not_fatal() -> None:
    reqs = _reqs(6, 2, spacing=1.0)
    reqs.insert(3, SimRequest(at=2.5, path="/v1/completions", key_body={"prompt": "x" * 100},
                              prompt_ids=list(range(2000)), max_tokens=4))
    res = simulate(reqs, SimConfig(replicas=2, kv_blocks=100))  # 1,600 tokens per replica
    assert res.rejected == 1 and res.requests == 6 and res.ttft["count"] == 6
    assert res.ceiling["requests"] == 6  # a replica refuses it, so the ceiling leaves it out


def test_a_burst_of_a_new_prefix_is_held_behind_its_first_prefill() -> None:
    """Streamed requests of one new 5k-token prompt arriving together: held behind the one
    prefilling it (as the app holds them), they prefill it once instead of side by side."""
    prompt = [7_000_000 + i for i in range(5000)]
    body = {"model": "m", "stream": True, "messages": [
        {"role": "system", "content": "a new prompt " * 400}, {"role": "user", "content": "q"}]}
    reqs = [SimRequest(at=i * 0.01, path="/v1/chat/completions", key_body=body,
                       prompt_ids=prompt + [i], max_tokens=4) for i in range(4)]
    cfg = dict(replicas=1, kv_blocks=2000, policy="cache_aware")
    held = simulate(reqs, SimConfig(**cfg))
    free = simulate(reqs, SimConfig(**cfg, routing={"hold_tokens": 0}))
    assert (held.holds, free.holds) == (3, 0)
    assert held.hit_rate == pytest.approx(held.ceiling["hit_rate"])  # every follower hit it all
    assert free.hit_rate < held.hit_rate - 0.05  # side by side they computed most of it again


def test_miss_attribution_splits_every_prompt_token() -> None:
    reqs = _reqs(60, 6, spacing=0.01)
    for policy in ("cache_aware", "round_robin", "sglang_model"):
        res = simulate(reqs, SimConfig(replicas=3, kv_blocks=200, policy=policy))
        m = res.misses
        assert set(m) == {"hit", "cold", "elsewhere", "lost_queued"}
        prompt = sum(len(r.prompt_ids) for r in reqs)
        assert sum(m.values()) >= prompt - 60 * 16  # each token once (lost_queued may overlap)
        assert m["hit"] == pytest.approx(res.hit_rate * prompt, abs=1)
    rr = simulate(reqs, SimConfig(replicas=3, kv_blocks=200, policy="round_robin")).misses
    ca = simulate(reqs, SimConfig(replicas=3, kv_blocks=200, policy="cache_aware")).misses
    assert rr["elsewhere"] > ca["elsewhere"]  # round-robin ignores where a prefix sits


def test_the_sglang_model_follows_a_match_over_its_threshold_else_the_smallest_tree() -> None:
    from loadtest.sglang_model import SglangModel
    from router.discovery.base import Endpoint
    from router.replicas import ReplicaSet

    rs = ReplicaSet([Endpoint(f"r{i}", f"sim://r{i}") for i in range(3)])
    model = SglangModel(rs)
    chat = "/v1/chat/completions"

    def req(system: str, user: str) -> dict[str, Any]:
        return {"model": "m", "messages": [{"role": "system", "content": system},
                                           {"role": "user", "content": user}]}

    long, other = "a long shared preamble " * 40, "another preamble " * 40
    first = model.route(chat, {}, req(long, "q1"), 1)
    assert first is not None and first.decision.replica == "r0"  # all trees empty: the first
    follow = model.route(chat, {}, req(long, "q2"), 2)  # > 30% matched: the same worker
    assert follow is not None and (follow.decision.replica, follow.decision.branch.value) == (
        "r0", "cache_hit")
    new = model.route(chat, {}, req(other, "q3"), 3)  # no match: the smallest tree
    assert new is not None and new.decision.replica == "r1"
    states = {s.name: s for s in rs.states()}
    states["r0"].in_flight, states["r1"].in_flight = 100, 10  # imbalanced: the least loaded
    spill = model.route(chat, {}, req(long, "q4"), 4)
    assert spill is not None and spill.decision.replica == "r2"


def test_bench_cell_replays_a_make_bench_cell_with_its_fleet() -> None:
    from loadtest.cells import WORKLOADS
    from loadtest.simulate import bench_cell

    reqs, cfg = bench_cell("rag", 4)
    w = next(w for w in WORKLOADS if w.name == "rag")
    assert len(reqs) == w.requests and cfg.kv_blocks == w.fleet.kv_blocks
    assert reqs[-1].at == pytest.approx((len(reqs) - 1) / w.rate)  # the bench's mean rate
    with pytest.raises(ValueError, match="no bench workload"):
        bench_cell("nope", 4)


def test_bench_cell_names_its_replicas_as_the_http_fleet_does() -> None:
    # the ring places keys by replica name: a replay with other names is another placement
    from loadtest.fleet import Fleet
    from loadtest.simulate import bench_cell

    reqs, cfg = bench_cell("rag", 4)
    res = simulate(reqs[:20], cfg)
    fleet = Fleet(replicas=4)  # not started: its names only
    assert sorted(res.per_replica_requests) == fleet.names == ["sim-0", "sim-1", "sim-2", "sim-3"]
    assert sorted(simulate(reqs[:20], SimConfig(replicas=2)).per_replica_requests) == ["r0", "r1"]


def test_precise_routing_runs_in_the_simulation_and_beats_round_robin() -> None:
    # cache_aware+kv: the precise index fed by the engines' block pools (zero-lag events)
    from loadtest.simulate import PRECISE

    reqs = workload_requests("cache-pressure", 300, 3, 20.0, prompts=12,
                             min_prompt_tokens=300, max_prompt_tokens=500, zipf_s=0.0)
    precise = simulate(reqs, SimConfig(replicas=4, policy=PRECISE, kv_blocks=60))
    rr = simulate(reqs, SimConfig(replicas=4, policy="round_robin", kv_blocks=60))
    assert precise.requests == rr.requests == 300
    assert precise.hit_rate > rr.hit_rate + 0.1
    assert precise.hit_rate <= precise.ceiling["hit_rate"] + 1e-9
    assert precise.branches.get("cache_hit", 0) > 0
    assert simulate(reqs, SimConfig(replicas=4, policy=PRECISE, kv_blocks=60)).hit_rate == \
        precise.hit_rate  # deterministic


def test_several_router_processes_route_the_same_requests_and_each_hears_every_engine() -> None:
    # routers=k: k Router instances, arrivals split round-robin, each precise index fed by every
    # engine (deterministic, so a 1-point difference between k and 1 routers is resolvable)
    from loadtest.simulate import PRECISE

    reqs = workload_requests("cache-pressure", 300, 3, 20.0, prompts=12,
                             min_prompt_tokens=300, max_prompt_tokens=500, zipf_s=0.0)
    cfg = SimConfig(replicas=4, policy=PRECISE, kv_blocks=60)
    one = simulate(reqs, cfg)
    assert simulate(reqs, replace(cfg, routers=1)).hit_rate == one.hit_rate
    three = simulate(reqs, replace(cfg, routers=3))
    rr = simulate(reqs, replace(cfg, policy="round_robin", routers=3))
    assert three.requests == one.requests == 300
    assert three.hit_rate > rr.hit_rate + 0.1
    assert three.branches.get("cache_hit", 0) > 0.5 * one.branches.get("cache_hit", 0)
    assert simulate(reqs, replace(cfg, routers=3)).hit_rate == three.hit_rate


def test_router_processes_that_share_in_flight_state_with_no_delay_route_as_one() -> None:
    # SimConfig.peer_delay: every process's attempts reach the others (router.peers.PeerState);
    # with no delay each process's view is the single router's, so the fleet hit rate is too
    from loadtest.simulate import PRECISE

    reqs = workload_requests("cache-pressure", 300, 3, 20.0, prompts=12,
                             min_prompt_tokens=300, max_prompt_tokens=500, zipf_s=0.0)
    for policy in (PRECISE, "cache_aware"):
        cfg = SimConfig(replicas=4, policy=policy, kv_blocks=60)
        one = simulate(reqs, cfg)
        alone = simulate(reqs, replace(cfg, routers=3))
        shared = simulate(reqs, replace(cfg, routers=3, peer_delay=0.0))
        assert one.peer_events == alone.peer_events == 0
        assert shared.peer_events >= 3 * 2 * 300  # start + ended per request, to 2 peers
        assert abs(shared.hit_rate - one.hit_rate) < 0.005 < one.hit_rate - alone.hit_rate
        late = simulate(reqs, replace(cfg, routers=3, peer_delay=0.05))
        assert late.peer_events == shared.peer_events and late.requests == 300
