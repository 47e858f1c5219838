"""The runner against a real tiny fleet (2 simulated replicas on 127.0.0.1), plus its pure parts.

Every run is bounded by a request count and a hard deadline; the fleets are stopped by PID.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest._net import quiet_port
from loadtest.client import ErrorKind
from loadtest.fleet import Fleet
from loadtest.runner import Plan, busy_seconds, run, scale_arrivals
from loadtest.setups import Setup, launch
from loadtest.stats import parse_prometheus
from loadtest.workloads import Request, WorkloadSpec, generate


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet(replicas=2, speed=20.0, kv_blocks=400) as f:
        yield f


def _workload(n: int, stream: bool = True, seed: int = 1) -> list[Request]:
    return generate(WorkloadSpec("shared-prefix", requests=n, rate=40.0, seed=seed, prompts=2,
                                 min_prompt_tokens=200, max_prompt_tokens=400, max_tokens=8,
                                 stream=stream))


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        return parse_prometheus(resp.read().decode())


def test_open_loop_streamed_counts_and_hit_rate(fleet: Fleet) -> None:
    before = [_scrape(u) for u in fleet.urls]
    res = run(Plan(fleet.urls[0], rate=40.0, max_requests=30, max_time=60.0,
                   replica_urls=tuple(fleet.urls)), _workload(30))
    after = [_scrape(u) for u in fleet.urls]
    s = res.summary()
    assert (s["requests"], s["sent"], s["ok"], s["error_count"]) == (30, 30, 30, 0)
    assert s["ttft"]["count"] == s["e2e"]["count"] == 30
    for o in res.outcomes:
        assert o.ttft is not None and o.e2e is not None and 0 < o.ttft <= o.e2e
        assert o.output_tokens == 8 and len(o.itl) == 7  # one gap between each pair of chunks
        assert o.replica == "sim-0"
    # the hit rate is the delta of the replicas' own counters, summed over the fleet
    hits = sum(a["vllm:prefix_cache_hits_total"] - b["vllm:prefix_cache_hits_total"]
               for a, b in zip(after, before, strict=True))
    queries = sum(a["vllm:prefix_cache_queries_total"] - b["vllm:prefix_cache_queries_total"]
                  for a, b in zip(after, before, strict=True))
    assert s["hit_tokens"] == hits and s["query_tokens"] == queries
    assert s["hit_rate"] == pytest.approx(hits / queries)
    # ... and agrees with the usage each response reported
    assert hits == sum(o.cached_tokens for o in res.outcomes)
    assert queries == sum(o.prompt_tokens for o in res.outcomes)
    # everything went to replica 0: max/mean over both replicas is 2
    assert s["per_replica"]["sim-0"]["requests"] == 30
    assert s["per_replica"]["sim-1"]["requests"] == 0
    assert s["load_max_over_mean"] == pytest.approx(2.0)
    assert 0 < s["per_replica"]["sim-0"]["busy_seconds"] <= res.wall_seconds
    assert s["output_tokens"] == 240


def test_closed_loop_non_streamed(fleet: Fleet) -> None:
    res = run(Plan(fleet.urls[1], concurrency=4, max_requests=24, max_time=60.0, stream=False,
                   replica_urls=tuple(fleet.urls)), _workload(24, stream=False, seed=2))
    s = res.summary()
    assert (s["sent"], s["ok"], s["not_sent"]) == (24, 24, 0)
    for o in res.outcomes:
        assert o.ttft == o.e2e  # a non-streamed body arrives at once
        assert o.itl == () and o.output_tokens == 8 and o.status == 200
    assert s["per_replica"]["sim-1"]["requests"] == 24
    assert s["per_replica"]["sim-1"]["requests_seen"] == 24


def test_duration_bounds_a_closed_loop(fleet: Fleet) -> None:
    reqs = _workload(400, seed=3)
    res = run(Plan(fleet.urls[0], concurrency=2, duration=0.3, max_time=30.0), reqs)
    s = res.summary()
    assert 0 < s["sent"] < 400
    assert s["sent"] + s["not_sent"] == s["requests"] == 400
    assert s["ok"] == s["sent"]  # the duration stops sending; what was sent still completes


def test_hard_deadline_cancels_and_counts() -> None:
    with Fleet(replicas=1, fault_hang_rate=1.0) as hung:
        res = run(Plan(hung.urls[0], rate=50.0, max_requests=5, max_time=1.0), _workload(5))
    s = res.summary()
    assert s["errors"] == {"deadline": 5}
    assert s["ok"] == 0 and s["requests"] == 5
    assert all(o.error is ErrorKind.DEADLINE for o in res.outcomes)


def test_errors_by_kind(fleet: Fleet) -> None:
    closed = f"http://127.0.0.1:{quiet_port()}"
    res = run(Plan(closed, concurrency=2, max_requests=4, max_time=20.0), _workload(4))
    assert res.summary()["errors"] == {"connect": 4}
    bad = [Request(i, 0.0, "/v1/chat/completions", {"model": "sim-model", "max_tokens": 0,
                                                    "messages": [{"role": "user", "content": "x"}]},
                   group="bad") for i in range(3)]
    res = run(Plan(fleet.urls[0], concurrency=1, max_requests=3, max_time=20.0), bad)
    s = res.summary()
    assert s["errors"] == {"http_4xx": 3}
    assert {o.status for o in res.outcomes} == {400}
    assert s["ttft"]["count"] == 0  # failed requests never enter the percentiles


def test_through_the_router_load_is_attributed_by_header(fleet: Fleet, tmp_path: Path) -> None:
    replicas = list(zip(fleet.names, fleet.urls, strict=True))
    with launch(Setup("router", "round_robin"), replicas, tmp_path) as router:
        res = run(Plan(router.url, concurrency=1, max_requests=20, max_time=60.0,
                       replica_urls=tuple(fleet.urls)), _workload(20, seed=4))
    s = res.summary()
    assert s["ok"] == 20
    seen = {name: row["requests_seen"] for name, row in s["per_replica"].items()}
    assert seen == {"sim-0": 10, "sim-1": 10}
    assert s["load_max_over_mean"] == pytest.approx(1.0)


def test_cli_writes_json_and_markdown(fleet: Fleet, tmp_path: Path) -> None:
    from loadtest.cli import main

    out, md = tmp_path / "r.json", tmp_path / "r.md"
    code = main(["run", "--target", fleet.urls[0], "--workload", "shared-prefix",
                 "--concurrency", "2", "--requests", "6", "--prompts", "2",
                 "--min-prompt-tokens", "100", "--max-prompt-tokens", "200",
                 "--replica-url", fleet.urls[0], "--replica-url", fleet.urls[1],
                 "--out", str(out), "--markdown", str(md)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["summary"]["ok"] == 6 and len(data["outcomes"]) == 6
    assert data["plan"]["mode"] == "closed"
    assert "fleet prefix-cache hit rate" in md.read_text()


# -- pure parts ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("intervals", "expected"), [
    ([], 0.0),                                   # nothing open
    ([(0, 1)], 1.0),                             # one request
    ([(0, 1), (0.5, 2)], 2.0),                   # overlapping requests count once
    ([(0, 1), (2, 3)], 2.0),                     # idle gap is not busy
    ([(2, 3), (0, 1), (0.2, 0.4)], 2.0),         # unsorted, nested
])
def test_busy_seconds(intervals: list[tuple[float, float]], expected: float) -> None:
    assert busy_seconds(intervals) == pytest.approx(expected)


def test_scale_arrivals_hits_the_mean_rate() -> None:
    reqs = [Request(i, 5.0 + 2.0 * i, "/v1/completions", {}, "g") for i in range(11)]
    scaled = scale_arrivals(reqs, rate=10.0)
    assert scaled[0].at == 0.0
    assert scaled[-1].at == pytest.approx(1.0)  # 10 gaps at 10/s
    same = [Request(i, 0.0, "/v1/completions", {}, "g") for i in range(3)]
    assert [r.at for r in scale_arrivals(same, rate=2.0)] == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("kwargs", [
    {"rate": 1.0, "concurrency": 1, "max_requests": 1},   # both modes
    {"max_requests": 1},                                   # neither mode
    {"rate": 1.0},                                         # unbounded
    {"rate": 0.0, "max_requests": 1},                      # no arrivals
])
def test_plan_rejects(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Plan("http://127.0.0.1:1", **kwargs)  # type: ignore[arg-type]


def test_sse_error_event_is_a_stream_error(threaded_server) -> None:  # type: ignore[no-untyped-def]
    # What the router sends when the upstream fails mid-stream: a data event with an "error".
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def chat(request):  # type: ignore[no-untyped-def]
        async def body():  # type: ignore[no-untyped-def]
            yield b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
            yield b'data: {"error":{"message":"upstream sim-0 closed the stream"}}\n\n'
        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"x-prefix-router-replica": "sim-0"})

    srv = threaded_server(Starlette(routes=[Route("/v1/chat/completions", chat,
                                                  methods=["POST"])]))
    res = run(Plan(srv.url, concurrency=1, max_requests=2, max_time=20.0), _workload(2))
    s = res.summary()
    assert s["errors"] == {"stream_error": 2}
    assert s["error_examples"] == {"stream_error": "upstream sim-0 closed the stream"}
    assert all(o.replica == "sim-0" and o.ttft is None for o in res.outcomes)


def test_progress_bar_draws_only_when_asked() -> None:
    import io

    from loadtest.progress import Progress

    quiet = io.StringIO()
    Progress(10, stream=quiet).update(5)  # StringIO is not a TTY
    assert quiet.getvalue() == ""
    out = io.StringIO()
    bar = Progress(10, "w", stream=out, enabled=True, interval=0.0, width=10)
    bar.update(5, errors=1)
    bar.close()
    assert "w [#####-----] 5/10 errors=1" in out.getvalue()
    assert out.getvalue().endswith("\n")


def test_nginx_headers_carry_the_key_and_the_model() -> None:
    from loadtest.runner import prefix_hash_headers
    from loadtest.workloads import Request

    body = {"model": "sql", "messages": [{"role": "system", "content": "S" * 200},
                                         {"role": "user", "content": "hi"}]}
    short = {"messages": [{"role": "user", "content": "hi"}]}
    got = prefix_hash_headers([Request(0, 0.0, "/v1/chat/completions", body, "g"),
                               Request(1, 0.0, "/v1/chat/completions", short, "g")],
                              "X-Prefix-Hash")
    assert set(got[0]) == {"X-Prefix-Hash", "X-Model"} and got[0]["X-Model"] == "sql"
    assert got[1] == {}  # no cacheable prefix, no model
