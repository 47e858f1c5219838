"""compare: the same requests through several setups, each on a cold fleet (real processes)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from loadtest.compare import FleetParams, compare, scrape_branches
from loadtest.runner import Plan, run
from loadtest.setups import Setup, parse_setup
from loadtest.workloads import WorkloadSpec, generate


def test_parse_setup_names() -> None:
    assert parse_setup("router-prefix") == Setup("router", "prefix")
    assert parse_setup("sglang-cache_aware").name == "sglang-cache_aware"
    assert parse_setup("nginx").prefix_hash_header == "X-Prefix-Hash"
    assert parse_setup("router-round_robin").prefix_hash_header is None
    with pytest.raises(ValueError):
        parse_setup("haproxy")


def test_router_branches_parse() -> None:
    from loadtest.compare import router_branches

    text = (
        '# HELP prefix_router_requests_total x\n'
        'prefix_router_requests_total{replica="a",branch="home",status="200"} 7.0\n'
        'prefix_router_requests_total{replica="b",branch="home",status="200"} 3.0\n'
        'prefix_router_requests_total{replica="b",branch="spill",status="503"} 2.0\n'
        'prefix_router_in_flight{replica="a"} 1.0\n'
    )
    assert router_branches(text) == {"home": 10, "spill": 2}


def test_missing_software_is_skipped_with_its_reason(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setattr("loadtest.setups.shutil.which", lambda name, **_: None)
    plan = Plan("http://unused", rate=10.0, max_requests=1)
    res = compare({"w": ([], {"name": "w"})}, [Setup("vllm", "consistent_hash")], plan,
                  FleetParams(replicas=1), tmp_path, log=lambda _m: None)
    block = res["workloads"]["w"]
    assert block["setups"] == {}
    assert "vllm-router is not installed" in block["skipped"]["vllm-consistent_hash"]


def _split_seed() -> int:
    """The first seed whose two system prompts have different homes on the router's ring for
    replicas sim-0/sim-1 (the ring hashes names, so this is fixed by the code, not the run)."""
    from router.client import hash_key
    from router.ring import HashRing, RingMember

    ring = HashRing([RingMember("sim-0"), RingMember("sim-1")])
    for seed in range(100):
        reqs = generate(_spec(seed))
        homes = {r.group: ring.home(hash_key(r.body) or "") for r in reqs}
        if len(homes) == 2 and len(set(homes.values())) == 2:
            return seed
    raise AssertionError("no seed splits the two prompts")


def _spec(seed: int) -> WorkloadSpec:
    return WorkloadSpec("shared-prefix", requests=40, rate=10.0, seed=seed, prompts=2, zipf_s=0.0,
                        min_prompt_tokens=1400, max_prompt_tokens=1600, max_tokens=8)


@pytest.mark.slow
def test_short_compare_prefix_vs_round_robin(tmp_path: Path) -> None:
    # Two system prompts of ~1.5k tokens (~95 blocks) on 2 replicas whose KV cache holds 130
    # blocks: one prompt fits, both do not. Round robin makes each replica alternate between the
    # prompts and evict them; prefix routing gives each prompt its own home (the seed is chosen
    # so that the homes differ), so prefix hit rate >= round robin's.
    requests = generate(_spec(_split_seed()))
    plan = Plan("http://unused", rate=10.0, max_requests=40, max_time=60.0)
    params = FleetParams(replicas=2, kv_blocks=130, speed=4.0)
    res = compare({"shared-prefix": (requests, {"name": "shared-prefix", "requests": 40})},
                  [Setup("router", "prefix"), Setup("router", "round_robin")], plan, params,
                  tmp_path, log=lambda _m: None)
    block = res["workloads"]["shared-prefix"]
    assert set(block["setups"]) == {"router-prefix", "router-round_robin"}
    assert block["failed"] == {}
    prefix, rr = block["setups"]["router-prefix"], block["setups"]["router-round_robin"]
    for s in (prefix, rr):
        assert s["ok"] == 40 and s["error_count"] == 0
        assert 0.0 <= s["hit_rate"] <= 1.0
        assert 0 < s["ttft"]["p50"] <= s["e2e"]["p50"]
        assert sum(r["requests"] for r in s["per_replica"].values()) == 40  # cold fleet each
        assert len(block["ttft"]) == 2 and len(block["ttft"]["router-prefix"]) == 40
    assert rr["load_max_over_mean"] == pytest.approx(1.0)
    # the router's own decision counters, scraped after the run
    assert rr["router_branches"] == {"round_robin": 40}
    assert sum(prefix["router_branches"].values()) == 40 and "home" in prefix["router_branches"]
    assert prefix["hit_rate"] >= rr["hit_rate"]
    # one cache of both replicas' size holds both prompts: no router can beat it here
    assert block["ceiling"]["num_blocks"] == 260 and block["ceiling"]["requests"] == 40
    assert prefix["hit_rate"] <= block["ceiling"]["hit_rate"] < 1.0
    json.dumps(res)  # JSON-ready as returned

    from loadtest.plots import compare_plots
    from loadtest.report import compare_markdown

    md = compare_markdown(res)
    assert md.count("| router-") == 2
    paths = compare_plots(res, tmp_path / "img")
    assert [p.name for p in paths] == ["compare-shared-prefix.png"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_mooncake_slice_keeps_whole_conversations(tmp_path: Path) -> None:
    from loadtest.bench import mooncake_slice

    recs = [  # conversation = second block id; 7 has one turn; 9's second turn is too long
        {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 5, 6]},
        {"timestamp": 1, "input_length": 1000, "output_length": 5, "hash_ids": [0, 7]},
        {"timestamp": 2, "input_length": 1000, "output_length": 5, "hash_ids": [0, 9]},
        {"timestamp": 3, "input_length": 1500, "output_length": 5, "hash_ids": [0, 5, 6, 8]},
        {"timestamp": 4, "input_length": 9999, "output_length": 5, "hash_ids": [0, 9, 10]},
        {"timestamp": 5, "input_length": 1000, "output_length": 5, "hash_ids": [0, 11]},
        {"timestamp": 6, "input_length": 1200, "output_length": 5, "hash_ids": [0, 11, 12]},
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = mooncake_slice(trace, tmp_path / "s.jsonl", requests=4, max_input_tokens=2000)
    got = [json.loads(line)["timestamp"] for line in out.read_text().splitlines()]
    assert got == [0, 3, 5, 6]


def test_parse_setup_with_processes() -> None:
    s = parse_setup("router-cache_aware-x2")
    assert (s.kind, s.policy, s.processes, s.name) == ("router", "cache_aware", 2,
                                                       "router-cache_aware-x2")
    assert s.single == Setup("router", "cache_aware") and s.single.name == "router-cache_aware"
    assert parse_setup("sglang-cache_aware-x1").name == "sglang-cache_aware-x1"
    assert parse_setup("router-least_loaded").processes is None
    peers = parse_setup("router-cache_aware-x4+kv+peers")
    assert (peers.processes, peers.kv, peers.peers, peers.name) == (
        4, True, True, "router-cache_aware-x4+kv+peers")
    assert peers.single == Setup("router", "cache_aware", kv=True, peers=True)
    for bad in ("nginx-x2", "router-prefix-x0", "sglang-cache_aware-x2+peers"):
        with pytest.raises(ValueError):
            parse_setup(bad)


@pytest.mark.parametrize(("text", "workers", "noshare", "kind"), [
    ("router-cache_aware-w2", 2, False, "router"),           # one process, two workers
    ("router-cache_aware-w4+noshare", 4, True, "router"),    # ... sharing nothing
    ("smg-cache_aware", None, False, "smg"),                 # the peer routers
    ("vllm-kv_aware", None, False, "vllm"),
])
def test_parse_setup_workers_and_peers(text: str, workers: int | None, noshare: bool,
                                       kind: str) -> None:
    s = parse_setup(text)
    assert (s.kind, s.workers, s.noshare, s.name) == (kind, workers, noshare, text)


@pytest.mark.parametrize("bad", ["sglang-cache_aware-w2", "router-cache_aware-w0",
                                 "smg-cache_aware+noshare", "router-prefix+shared"])
def test_parse_setup_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_setup(bad)


@pytest.mark.slow
def test_router_processes_behind_the_splitter_share_the_traffic(tmp_path: Path) -> None:
    from loadtest.fleet import Fleet
    from loadtest.setups import launch

    with Fleet(replicas=2, instant=True) as fleet:
        replicas = list(zip(fleet.names, fleet.urls, strict=True))
        with launch(parse_setup("router-round_robin-x2"), replicas, tmp_path) as split:
            assert len(split.urls) == 2 and split.url not in split.urls
            reqs = generate(_spec(0))[:20]
            res = run(Plan(split.url, concurrency=4, max_requests=20, max_time=60.0,
                           replica_urls=tuple(fleet.urls)), reqs)
            decided = [sum(scrape_branches(u).values()) for u in split.urls]
        assert res.summary()["ok"] == 20
        assert sum(decided) == 20 and min(decided) >= 1  # both processes routed some
        # stop() stopped every process it started: the splitter and both routers
        assert [p.proc.poll() is not None for p in (split, *split.parts) if p.proc] == [True] * 3


@pytest.mark.slow
def test_router_processes_with_peers_mirror_each_others_requests(tmp_path: Path) -> None:
    from loadtest.fleet import Fleet
    from loadtest.setups import launch

    with Fleet(replicas=2, instant=True) as fleet:
        replicas = list(zip(fleet.names, fleet.urls, strict=True))
        with launch(parse_setup("router-cache_aware-x2+peers"), replicas, tmp_path) as split:
            # PUB/SUB drops what is published before a subscription reaches the publisher (ZMQ's
            # slow joiner): start the traffic once each process has heard the other's hello
            # (sent every second), as a router pod joining a running fleet would be by then
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and min(
                    _sample(u, "prefix_router_peer_events_received_total", 'type="hello"')
                    for u in split.urls) < 1:
                time.sleep(0.1)
            reqs = generate(_spec(0))[:20]
            res = run(Plan(split.url, concurrency=4, max_requests=20, max_time=60.0,
                           replica_urls=tuple(fleet.urls)), reqs)
            starts = [_sample(u, "prefix_router_peer_events_received_total", 'type="start"')
                      for u in split.urls]
        assert res.summary()["ok"] == 20
        # each process received the other's dispatches over its ipc socket
        assert min(starts) >= 1 and sum(starts) <= 20, starts


def _sample(url: str, name: str, label: str) -> float:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and label in line)
