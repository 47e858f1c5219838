from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from router.health import HealthMonitor, VllmLoad, parse_vllm_metrics
from router.metrics import RouterMetrics
from router.replicas import ReplicaSet
from router.settings import HealthSettings, ReplicaSpec, ScrapeSettings
from tests.integration.conftest import FakeReplica


@pytest.mark.parametrize(("text", "expected"), [
    # summed over label sets (two engines), kv usage is the max so it stays a fraction
    ('vllm:num_requests_running{engine="0",model_name="m"} 3\n'
     'vllm:num_requests_running{engine="1",model_name="m"} 2\n'
     'vllm:num_requests_waiting{model_name="m"} 4.0\n'
     'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:kv_cache_usage_perc{engine="1"} 0.75\n',
     VllmLoad(5, 4, 0.75)),
    # comments, other metrics, the older gpu_cache name and a trailing timestamp
    ('# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n'
     'vllm:num_requests_running 7 1700000000000\nvllm:gpu_cache_usage_perc 0.1\n'
     'vllm:num_requests_running_total 99\nprocess_cpu_seconds_total 5\n', VllmLoad(7, 0, 0.1)),
    # a '}' inside a label value and a NaN are handled
    ('vllm:num_requests_waiting{model_name="a}b"} 2\nvllm:num_requests_running NaN\n',
     VllmLoad(0, 2, 0)),
    ("", VllmLoad(0, 0, 0)),
    ("vllm:num_requests_running{model_name=\"m\"} garbage\n", VllmLoad(0, 0, 0)),
])
def test_parse_vllm_metrics(text: str, expected: VllmLoad) -> None:
    assert parse_vllm_metrics(text) == expected


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def monitor(n: int = 2, **health: Any) -> tuple[HealthMonitor, ReplicaSet, Clock, list[str]]:
    replicas = ReplicaSet([ReplicaSpec(f"r{i}", f"http://127.0.0.1:{9 + i}") for i in range(n)])
    clock = Clock()
    changes: list[str] = []
    settings = HealthSettings(**{"eject_after": 3, "readmit_backoff": 1.0,
                                 "readmit_backoff_max": 8.0, **health})
    m = HealthMonitor(settings, ScrapeSettings(), replicas, RouterMetrics(),
                      on_change=lambda: changes.append("x"), clock=clock)
    return m, replicas, clock, changes


def test_ejects_after_consecutive_failures_only() -> None:
    m, rs, _, changes = monitor()
    r0 = rs.get("r0")
    assert r0 is not None
    m.record_failure(r0, "connect")
    m.record_failure(r0, "5xx")
    m.record_success(r0)  # resets the streak
    m.record_failure(r0, "connect")
    m.record_failure(r0, "connect")
    assert r0.healthy
    m.record_failure(r0, "timeout")
    assert not r0.healthy and changes == ["x"]
    body, _ = m.metrics.render()
    assert b'prefix_router_ejections_total{reason="timeout",replica="r0"} 1.0' in body


class ScriptedProbe(HealthMonitor):
    """Probe answers come from a script instead of the network."""

    answers: dict[str, list[bool]]

    async def probe(self, session: Any, replica: Any) -> bool:
        return self.answers[replica.name].pop(0)

    async def learn_models(self, session: Any, replica: Any) -> bool:
        return False  # no /v1/models to read: the script answers /health only


def scripted(**health: Any) -> tuple[ScriptedProbe, ReplicaSet, Clock]:
    m, rs, clock, _ = monitor(**health)
    sp = ScriptedProbe(m.health, m.scrape, rs, m.metrics, clock=clock)
    return sp, rs, clock


def test_readmission_backoff_doubles_until_a_probe_succeeds() -> None:
    m, rs, clock = scripted()
    r0 = rs.get("r0")
    assert r0 is not None
    for _ in range(3):
        m.record_failure(r0, "connect")
    assert not r0.healthy
    m.answers = {"r0": [False, False, False, True], "r1": [True] * 20}
    probed_at: list[float] = []

    async def run() -> None:
        for _ in range(40):  # 0.5 s ticks over 20 s of fake time
            before = len(m.answers["r0"])
            await m.probe_once(None)  # type: ignore[arg-type]
            if len(m.answers["r0"]) < before:
                probed_at.append(clock.t - 1000.0)
            if r0.healthy:
                return
            clock.t += 0.5

    asyncio.run(run())
    assert r0.healthy
    # ejected at t=0; backoff 1, then 2, 4, 8 (capped at readmit_backoff_max)
    assert probed_at == [1.0, 3.0, 7.0, 15.0]


def test_active_probe_failures_eject_a_healthy_replica() -> None:
    m, rs, clock = scripted(eject_after=2, interval=1.0)
    m.answers = {"r0": [False, False], "r1": [True, True]}
    asyncio.run(m.probe_once(None))  # type: ignore[arg-type]
    r0, r1 = rs.get("r0"), rs.get("r1")
    assert r0 is not None and r1 is not None
    assert r0.healthy
    clock.t += 1.0
    asyncio.run(m.probe_once(None))  # type: ignore[arg-type]
    assert not r0.healthy and r1.healthy


async def _with_session(coro_fn: Any) -> Any:
    async with aiohttp.ClientSession() as session:
        return await coro_fn(session)


def test_probe_and_scrape_a_real_replica(threaded_server: Any) -> None:
    fake = FakeReplica("r0")
    fake.running = 3
    srv = threaded_server(fake.app())
    replicas = ReplicaSet([ReplicaSpec("r0", srv.url),
                           ReplicaSpec("dead", "http://127.0.0.1:9")])
    metrics = RouterMetrics()
    m = HealthMonitor(HealthSettings(timeout=1.0), ScrapeSettings(), replicas, metrics)
    r0, dead = replicas.get("r0"), replicas.get("dead")
    assert r0 is not None and dead is not None

    async def check(session: aiohttp.ClientSession) -> tuple[bool, bool, bool]:
        ok = await m.probe(session, r0)
        bad = await m.probe(session, dead)
        fake.healthy = False
        down = await m.probe(session, r0)
        await m.scrape_once(session)
        return ok, bad, down

    ok, bad, down = asyncio.run(_with_session(check))
    assert (ok, bad, down) == (True, False, False)
    assert (r0.running, r0.waiting, r0.kv_usage) == (3, 0, 0.25)
    assert (dead.running, dead.kv_usage) == (0, 0)  # failed scrape -> no scraped load
    assert dead.healthy  # a failed scrape never ejects
    # the scraped signal is exported, so operators see what the policy sees
    text = metrics.render()[0].decode()
    assert 'prefix_router_replica_scraped_load{metric="running",replica="r0"} 3.0' in text
    assert 'prefix_router_replica_scraped_load{metric="kv_usage",replica="r0"} 0.25' in text


class ScriptedMetrics:
    """A replica whose /metrics answers as told: its load, slowly (past the scrape timeout) or
    with a status code; ``during`` seconds pass on ``clock`` while it answers."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.running = 4
        self.mode = "ok"
        self.clock = clock
        self.during = 0.0

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.responses import PlainTextResponse
        from starlette.routing import Route

        async def metrics(_: Any) -> PlainTextResponse:
            if self.clock is not None:
                self.clock.t += self.during
            if self.mode == "slow":
                await asyncio.sleep(1.0)
            if self.mode == "500":
                return PlainTextResponse("no", status_code=500)
            return PlainTextResponse(
                f"vllm:num_requests_running {self.running}\nvllm:num_requests_waiting 2\n"
                "vllm:kv_cache_usage_perc 0.5\n"
                'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1\n')

        return Starlette(routes=[Route("/metrics", metrics)])


def test_a_failed_scrape_keeps_the_last_load_until_it_is_stale(threaded_server: Any) -> None:
    clock = Clock()
    fake = ScriptedMetrics(clock)
    srv = threaded_server(fake.app())
    replicas = ReplicaSet([ReplicaSpec("r0", srv.url)])
    metrics = RouterMetrics()
    m = HealthMonitor(HealthSettings(timeout=0.3), ScrapeSettings(stale_after=5.0), replicas,
                      metrics, clock=clock)
    r0 = replicas.get("r0")
    assert r0 is not None
    seen: list[tuple[float, float, float, int]] = []

    async def scrape(session: aiohttp.ClientSession) -> None:
        for k, (mode, advance) in enumerate((("ok", 0.0), ("slow", 2.0), ("500", 2.5),
                                             ("500", 1.0), ("ok", 0.0), ("slow", 4.0),
                                             ("slow", 1.5))):
            fake.mode = mode
            clock.t += advance
            r0.unstarted = k  # ours not started yet, as the scrape begins
            await m.scrape_once(session)
            seen.append((r0.running, r0.waiting, r0.kv_usage, r0.scraped_unstarted))

    asyncio.run(_with_session(scrape))
    good = (4.0, 2.0, 0.5)
    # answered at t=0; failures at 2 and 4.5 s keep it; at 5.5 s it is stale and reads 0. The
    # next answer (t=5.5) restarts the window: a failure at 9.5 s keeps it, one at 11 s does not.
    # `scraped_unstarted` stays with the load it belongs to: ours among *that* scrape's waiting.
    assert seen == [(*good, 0), (*good, 0), (*good, 0), (0, 0, 0, 3), (*good, 4), (*good, 4),
                    (0, 0, 0, 6)]
    assert r0.kv_capacity == 1600  # the capacity outlives a stale load
    text = metrics.render()[0].decode()
    assert 'prefix_router_scrape_failures_total{reason="timeout",replica="r0"} 3.0' in text
    assert 'prefix_router_scrape_failures_total{reason="status",replica="r0"} 2.0' in text
    # the exported gauge is what the policy sees: zero once stale
    assert 'prefix_router_replica_scraped_load{metric="running",replica="r0"} 0.0' in text


def test_the_window_runs_start_to_start_whatever_the_timeout(threaded_server: Any) -> None:
    # a replica that takes 10 s (clock time) to fail its scrape: the failure began 1 s after the
    # last good scrape began, so the load is kept although the last answer is now 11 s old
    clock = Clock()
    fake = ScriptedMetrics(clock)
    srv = threaded_server(fake.app())
    replicas = ReplicaSet([ReplicaSpec("r0", srv.url)])
    m = HealthMonitor(HealthSettings(timeout=30.0), ScrapeSettings(stale_after=5.0), replicas,
                      RouterMetrics(), clock=clock)
    r0 = replicas.get("r0")
    assert r0 is not None

    async def scrape(session: aiohttp.ClientSession) -> list[float]:
        running = []
        for mode, advance, during in (("ok", 0.0, 0.0), ("500", 1.0, 10.0), ("500", 0.0, 0.0)):
            fake.mode, fake.during = mode, during
            clock.t += advance
            await m.scrape_once(session)
            running.append(r0.running)
        return running

    # the third failure starts 11 s after the last good start: stale
    assert asyncio.run(_with_session(scrape)) == [4.0, 4.0, 0.0]


def test_stale_after_zero_drops_the_load_at_the_first_failure(threaded_server: Any) -> None:
    fake = ScriptedMetrics()
    srv = threaded_server(fake.app())
    replicas = ReplicaSet([ReplicaSpec("r0", srv.url), ReplicaSpec("dead", "http://127.0.0.1:9")])
    metrics = RouterMetrics()
    m = HealthMonitor(HealthSettings(timeout=1.0), ScrapeSettings(stale_after=0.0), replicas,
                      metrics, clock=Clock())
    r0 = replicas.get("r0")
    assert r0 is not None

    async def scrape(session: aiohttp.ClientSession) -> tuple[float, float]:
        await m.scrape_once(session)
        before = r0.running
        fake.mode = "500"
        await m.scrape_once(session)
        return before, r0.running

    assert asyncio.run(_with_session(scrape)) == (4.0, 0.0)
    text = metrics.render()[0].decode()
    assert 'prefix_router_scrape_failures_total{reason="connect",replica="dead"} 2.0' in text


def test_loops_stop_when_cancelled(threaded_server: Any) -> None:
    fake = FakeReplica("r0")
    srv = threaded_server(fake.app())
    replicas = ReplicaSet([ReplicaSpec("r0", srv.url)])
    m = HealthMonitor(HealthSettings(interval=0.05, readmit_backoff=0.05),
                      ScrapeSettings(interval=0.05), replicas, RouterMetrics())
    fake.running = 2
    r0 = replicas.get("r0")
    assert r0 is not None

    async def run(session: aiohttp.ClientSession) -> bool:
        tasks = [asyncio.create_task(m.run_probes(session)),
                 asyncio.create_task(m.run_scrapes(session))]
        for _ in range(100):
            if r0.running == 2:
                break
            await asyncio.sleep(0.02)
        fake.healthy = False
        for _ in range(200):
            if not r0.healthy:
                break
            await asyncio.sleep(0.02)
        for t in tasks:
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return all(isinstance(r, asyncio.CancelledError) for r in results)

    assert asyncio.run(_with_session(run))
    assert r0.running == 2 and not r0.healthy


def test_kv_capacity_from_cache_config_info_labels() -> None:
    from router.health import kv_capacity_tokens, parse_vllm_metrics

    text = ('vllm:cache_config_info{block_size="16",cache_dtype="auto",'
            'enable_prefix_caching="True",num_gpu_blocks="2048",model_name="m"} 1.0\n'
            'vllm:num_requests_running{model_name="m"} 2.0\n')
    assert parse_vllm_metrics(text).kv_capacity == 2048 * 16
    assert kv_capacity_tokens('{block_size="16",num_gpu_blocks="None"}') == 0  # before profiling
    assert kv_capacity_tokens('{block_size="16"}') == 0
    assert kv_capacity_tokens('{xnum_gpu_blocks="9",num_gpu_blocks="4",block_size="8"}') == 32
    # labels as a real vLLM (CPU, 0.x) exports them: hash_block_size must not read as block_size
    assert kv_capacity_tokens('{_block_size_resolved="True",hash_block_size="None",engine="0",'
                              'block_size="32",num_gpu_blocks="256"}') == 256 * 32
    assert parse_vllm_metrics("vllm:num_requests_running 1\n").kv_capacity == 0


def test_a_failed_scrape_keeps_the_lora_state_an_answer_without_the_gauge_clears_it(
        threaded_server: Any) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    lora = ('# TYPE vllm:lora_requests_info gauge\n'
            'vllm:lora_requests_info{max_lora="1",running_lora_adapters="sql",'
            'waiting_lora_adapters=""} 1.79e+09\n')
    # what /metrics answers, one scrape after the other: a LoRA sample, a failure (status 500),
    # an answer with only the family (vLLM restarted and has served nothing yet)
    answers = [(200, lora), (500, "boom"), (200, "# TYPE vllm:lora_requests_info gauge\n")]

    async def metrics(request: Request) -> Response:
        status, text = answers.pop(0)
        return PlainTextResponse(text, status_code=status)

    srv = threaded_server(Starlette(routes=[Route("/metrics", metrics)]))
    replicas = ReplicaSet([ReplicaSpec("r0", srv.url)])
    m = HealthMonitor(HealthSettings(timeout=5.0), ScrapeSettings(), replicas, RouterMetrics())
    r0 = replicas.get("r0")
    assert r0 is not None
    seen: list[tuple[frozenset[str], int]] = []

    async def scrape_thrice(session: aiohttp.ClientSession) -> None:
        for _ in range(3):
            await m.scrape_once(session)
            seen.append((r0.lora_running, r0.max_lora))

    asyncio.run(_with_session(scrape_thrice))
    assert seen == [(frozenset({"sql"}), 1), (frozenset({"sql"}), 1), (frozenset(), 0)]
