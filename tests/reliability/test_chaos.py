"""Chaos: a router process in front of 4 simulated replica processes under steady mixed load.

Each test breaks one thing on purpose while `run_load` keeps 16 requests open (every third one
streamed) and a poller reads the router's /metrics every 50 ms:

- kill -9 one replica: no non-streamed request fails; streams cut by the dying replica end with
  an SSE error event; the replica is ejected in bounded time, re-admitted after a restart; only
  its keys move, and they move back.
- hang (SIGSTOP: the kernel still accepts connections, nobody answers): streams stalled on it end
  with an SSE error within the idle timeout; it is ejected by failed probes.
- slow (10x): nothing fails, nothing is ejected.
- flap (SIGKILL, 1.5 s down, restart, 1.5 s up, twice): no non-streamed request fails;
  ejected and re-admitted every cycle.
- all down, then back: fast 503s with Retry-After, never timeouts; service resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from loadtest.fleet import Fleet
from tests.reliability.conftest import (
    FAST_HEALTH,
    RouterProcess,
    metric,
    parse_metrics,
    promise,
    router_config,
    scaled,
)
from tests.reliability.load import Outcome, distinct_keys, fill, one, placement, run_load, summary

pytestmark = pytest.mark.slow

KEYS = 32
IDLE_TIMEOUT = 1.0
# Timing promises: measured and recorded with `promise` (asserted only in the report run, see
# tests/reliability/conftest.py), never pass/fail facts of `make test` on a shared machine.
EJECT_WITHIN = 5.0
READMIT_WITHIN = 6.0
SSE_ERROR_WITHIN = IDLE_TIMEOUT + 2.0
HUNG_IDLE_TIMEOUT = 3.0   # test_hung_replica's (see there)
# How long a test waits for an ejection or a re-admission before it fails: a guard against a
# router that never does it, not a promise (a loaded machine stays far below it).
GIVE_UP = 60.0
LONG_STREAM = 256   # tokens: ~1 s at speed 5, so a kill or stop lands mid-stream


@dataclass
class Timeline:
    """Router health as seen through /metrics, sampled every `period` seconds."""

    url: str
    period: float = 0.05
    samples: list[tuple[float, dict[str, float], float]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                try:
                    async with session.get(self.url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                        s = parse_metrics(await r.text())
                except (aiohttp.ClientError, TimeoutError):
                    await asyncio.sleep(self.period)
                    continue
                healthy = {lab["replica"]: v for n, lab, v in s
                           if n == "prefix_router_replica_healthy"}
                self.samples.append((time.monotonic(), healthy,
                                     metric(s, "prefix_router_ejections_total")))
                await asyncio.sleep(self.period)

    def first(self, since: float, pred: Callable[[dict[str, float]], bool]) -> float | None:
        for t, healthy, _ in self.samples:
            if t >= since and pred(healthy):
                return t - since
        return None

    async def wait(self, since: float, pred: Callable[[dict[str, float]], bool],
                   within: float, what: str) -> float:
        while time.monotonic() - since < within:
            found = self.first(since, pred)
            if found is not None:
                return found
            await asyncio.sleep(self.period)
        raise AssertionError(f"{what} not seen within {within}s")


def chaos_router(start_router: Callable[..., RouterProcess], fleet: Fleet,
                 **sections: Any) -> RouterProcess:
    proxy = {"idle_timeout": IDLE_TIMEOUT, "first_byte_timeout": 5.0, **sections.pop("proxy", {})}
    health = {**FAST_HEALTH, **sections.pop("health", {})}
    cfg = router_config(fleet.urls, fleet.names, proxy=proxy, health=health, **sections)
    return start_router(cfg)


@pytest.fixture
def fleet4(start_fleet: Callable[..., Fleet]) -> Fleet:
    # speed 5: a 16-token stream takes ~50 ms, so a kill lands mid-stream on several of them
    return start_fleet(4, speed=5.0)


def non_streamed_failures(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if not o.stream and o.kind != "ok"]


def stream_failures(outcomes: list[Outcome]) -> list[Outcome]:
    """Streams that neither completed nor ended with an SSE error event. (A replica dying
    between its response headers and its first chunk is retried elsewhere, see
    `test_stream_dying_before_first_chunk_is_retried`, so no 502 is tolerated.)"""
    return [o for o in outcomes if o.stream and o.kind not in ("ok", "sse_error")]


def test_keys_are_distinct() -> None:
    # the key-movement assertions below are meaningless if keys collide
    assert distinct_keys(KEYS)


def test_kill_one_replica(fleet4: Fleet, start_router: Callable[..., RouterProcess],
                          measure: Callable[..., None]) -> None:
    router = chaos_router(start_router, fleet4)

    async def scenario() -> dict[str, Any]:
        # every replica holds something first, so that each key below goes to its ring home
        assert len(await fill(router.url, len(fleet4.names), first_key=KEYS)) == len(fleet4.names)
        before = await placement(router.url, KEYS)
        victim = Counter(before.values()).most_common(1)[0][0]
        assert victim is not None and None not in before.values()
        vi = fleet4.names.index(victim)
        timeline, stop_tl, stop_load = Timeline(router.metrics_url), asyncio.Event(), asyncio.Event()
        poller = asyncio.create_task(timeline.run(stop_tl))
        # 8 clients of short non-streamed requests, 8 of long streams (so some are mid-stream
        # on the victim when it dies)
        load = asyncio.gather(
            run_load(router.url, count=scaled(4000), duration=30, concurrency=8, keys=KEYS,
                     max_tokens=16, stream_every=1_000_000_000, stop=stop_load),
            run_load(router.url, count=scaled(400), duration=30, concurrency=8, keys=KEYS,
                     stream_every=1, max_tokens=4 * LONG_STREAM, stop=stop_load))
        await asyncio.sleep(1.0)
        t_kill = time.monotonic()
        await asyncio.to_thread(fleet4.kill, vi, signal.SIGKILL)
        eject = await timeline.wait(t_kill, lambda h: h.get(victim) == 0, GIVE_UP, "ejection")
        await asyncio.sleep(1.0)   # load keeps running against the three survivors
        stop_load.set()
        plain, streams = await load
        outcomes = plain + streams
        during = await placement(router.url, KEYS)
        t_restart = time.monotonic()
        await asyncio.to_thread(fleet4.restart, vi)
        t_up = time.monotonic()
        readmit = await timeline.wait(t_up, lambda h: h.get(victim) == 1, GIVE_UP,
                                      "re-admission")
        after = await placement(router.url, KEYS)
        stop_tl.set()
        await poller
        return dict(before=before, during=during, after=after, victim=victim,
                    outcomes=outcomes, t_kill=t_kill, eject=eject, readmit=readmit,
                    restart_took=t_up - t_restart)

    r = asyncio.run(scenario())
    outcomes: list[Outcome] = r["outcomes"]
    victim = r["victim"]
    samples = router.samples()
    cut = [o for o in outcomes if o.kind == "sse_error"]
    measure("chaos_kill", **summary(outcomes), eject_seconds=round(r["eject"], 3),
            readmit_seconds_after_restart=round(r["readmit"], 3),
            retries=metric(samples, "prefix_router_retries_total"),
            streams_cut=len(cut),
            slowest_cut_stream_end_after_kill=round(max(
                (o.t_end - r["t_kill"] for o in cut), default=0.0), 3),
            keys=KEYS, keys_on_victim=sum(v == victim for v in r["before"].values()))
    assert non_streamed_failures(outcomes) == []
    assert stream_failures(outcomes) == []
    assert cut, "no stream was open on the victim when it died: the scenario proved nothing"
    promise(measure, "chaos_kill", "eject", r["eject"], EJECT_WITHIN)
    promise(measure, "chaos_kill", "readmit", r["readmit"], READMIT_WITHIN)
    promise(measure, "chaos_kill", "cut_stream_end", max(o.t_end - r["t_kill"] for o in cut),
            SSE_ERROR_WITHIN)
    assert metric(samples, "prefix_router_ejections_total", replica=victim) >= 1
    # only the victim's keys moved, and they all came back
    moved = {k for k in range(KEYS) if r["during"][k] != r["before"][k]}
    assert moved == {k for k in range(KEYS) if r["before"][k] == victim}
    assert victim not in r["during"].values()
    assert r["after"] == r["before"]


def test_hung_replica(fleet4: Fleet, start_router: Callable[..., RouterProcess],
                      measure: Callable[..., None]) -> None:
    """SIGSTOP: connections are still accepted by the kernel, nothing is ever answered.

    The idle timeout is HUNG_IDLE_TIMEOUT here: it cuts the streams stalled on the stopped
    replica, and it must never cut one of a healthy replica that a loaded machine merely
    starved for a while (with 1 s it did, under two CPU hogs: a stream of sim-3 cut after
    1.25 s). The replica is resumed only once the idle timeout has cut a stream stalled on it
    (an event, not a fixed pause), so the scenario holds at any speed of the machine."""
    router = chaos_router(start_router, fleet4, proxy={"idle_timeout": HUNG_IDLE_TIMEOUT})
    victim_i = 1
    victim = fleet4.names[victim_i]

    async def scenario() -> dict[str, Any]:
        timeline, stop_tl, stop_load = Timeline(router.metrics_url), asyncio.Event(), asyncio.Event()
        cut_on_victim = asyncio.Event()

        def seen(o: Outcome) -> None:
            if o.stream and o.kind == "sse_error" and o.replica == victim:
                cut_on_victim.set()

        poller = asyncio.create_task(timeline.run(stop_tl))
        load = asyncio.create_task(run_load(router.url, count=scaled(4000), duration=120,
                                            concurrency=16, keys=KEYS, max_tokens=16,
                                            stream_tokens=LONG_STREAM, stop=stop_load,
                                            on_outcome=seen))
        await asyncio.sleep(1.0)
        t_stop = time.monotonic()
        pid = fleet4.pids[victim_i]
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        eject = await timeline.wait(t_stop, lambda h: h.get(victim) == 0, GIVE_UP,
                                    "ejection of the hung replica")
        t_ejected = t_stop + eject
        try:
            await asyncio.wait_for(cut_on_victim.wait(), GIVE_UP)
        except TimeoutError:
            raise AssertionError(f"no stream stalled on {victim} was cut in {GIVE_UP}s") from None
        await asyncio.sleep(1.0)   # requests keep coming while it is out of rotation
        os.kill(pid, signal.SIGCONT)
        t_cont = time.monotonic()
        readmit = await timeline.wait(t_cont, lambda h: h.get(victim) == 1, GIVE_UP,
                                      "re-admission of the resumed replica")
        stop_load.set()
        outcomes = await load
        stop_tl.set()
        await poller
        return dict(outcomes=outcomes, t_stop=t_stop, eject=eject, readmit=readmit,
                    t_settled=t_ejected, t_cont=t_cont)

    r = asyncio.run(scenario())
    outcomes: list[Outcome] = r["outcomes"]
    stalled = [o for o in outcomes if o.stream and o.kind == "sse_error"]
    failed_plain = non_streamed_failures(outcomes)
    measure("chaos_hang", **summary(outcomes), eject_seconds=round(r["eject"], 3),
            readmit_seconds_after_sigcont=round(r["readmit"], 3),
            streams_ended_by_idle_timeout=len(stalled),
            non_streamed_failed=len(failed_plain),
            non_streamed_failed_statuses=dict(Counter(o.status for o in failed_plain)))
    # nothing hangs: every request ended (stalled streams with an SSE error event, from the
    # idle timeout; how soon after the stall is a promise)
    assert all(o.kind != "exception" for o in outcomes)
    assert stalled, "no stream was open on the hung replica: the scenario proved nothing"
    assert failed_plain == []
    promise(measure, "chaos_hang", "eject", r["eject"], EJECT_WITHIN)
    promise(measure, "chaos_hang", "readmit", r["readmit"], READMIT_WITHIN)
    promise(measure, "chaos_hang", "stalled_stream_end",
            max(o.t_end - max(o.t_start, r["t_stop"]) for o in stalled), HUNG_IDLE_TIMEOUT + 2.0)
    # while the hung replica is out of rotation, nothing fails (from SIGCONT on it is back and
    # works off what queued up while it was stopped: that is the re-admission, not this check)
    assert [o for o in outcomes
            if o.kind != "ok" and r["t_settled"] < o.t_start < r["t_cont"]] == []


def test_hung_replica_loses_no_non_streamed_request(
        fleet4: Fleet, start_router: Callable[..., RouterProcess]) -> None:
    router = chaos_router(start_router, fleet4, proxy={"first_byte_timeout": 1.0})
    victim_i = 2

    async def scenario() -> list[Outcome]:
        stop = asyncio.Event()
        load = asyncio.create_task(run_load(router.url, count=scaled(2000), duration=20,
                                            concurrency=16, keys=KEYS, stream_every=1_000_000,
                                            stop=stop))
        await asyncio.sleep(0.5)
        pid = fleet4.pids[victim_i]
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(3.0)
        os.kill(pid, signal.SIGCONT)
        stop.set()
        return await load

    outcomes = asyncio.run(scenario())
    assert non_streamed_failures(outcomes) == []


def test_slow_replica(fleet4: Fleet, start_router: Callable[..., RouterProcess],
                      measure: Callable[..., None]) -> None:
    router = chaos_router(start_router, fleet4)
    slow = fleet4.names[0]
    fleet4.fault(0, slow=10.0)

    async def scenario() -> list[Outcome]:
        return await run_load(router.url, count=scaled(600), duration=20, concurrency=16,
                              keys=KEYS, max_tokens=16)

    outcomes = asyncio.run(scenario())
    samples = router.samples()
    served = Counter(o.replica for o in outcomes)
    slow_secs = [o.seconds for o in outcomes if o.replica == slow]
    fast_secs = [o.seconds for o in outcomes if o.replica != slow]
    measure("chaos_slow", **summary(outcomes), served=dict(served),
            mean_seconds_slow=round(sum(slow_secs) / max(1, len(slow_secs)), 4),
            mean_seconds_others=round(sum(fast_secs) / max(1, len(fast_secs)), 4),
            ejections=metric(samples, "prefix_router_ejections_total"))
    assert [o for o in outcomes if o.kind != "ok"] == []
    assert metric(samples, "prefix_router_ejections_total") == 0  # slow is not failed
    assert metric(samples, "prefix_router_replica_healthy", replica=slow) == 1


def test_flapping_replica(fleet4: Fleet, start_router: Callable[..., RouterProcess],
                          measure: Callable[..., None]) -> None:
    """Down (SIGKILL) for 1.5 s, up for 1.5 s, twice. (The replica's `refuse` fault is no
    flap for a router: it only refuses *new* connections, and the router's keep-alive pool and
    probe connections keep working, so the replica never looks down.)"""
    router = chaos_router(start_router, fleet4)
    flapper_i = 3
    flapper = fleet4.names[flapper_i]
    cycles, down, up = 2, 1.5, 1.5

    async def scenario() -> dict[str, Any]:
        timeline, stop_tl, stop_load = Timeline(router.metrics_url), asyncio.Event(), asyncio.Event()
        poller = asyncio.create_task(timeline.run(stop_tl))
        load = asyncio.create_task(run_load(router.url, count=scaled(8000), duration=60,
                                            concurrency=16, keys=KEYS, max_tokens=16,
                                            stop=stop_load))
        await asyncio.sleep(0.5)
        ejects, readmits = [], []
        for _ in range(cycles):
            t_down = time.monotonic()
            await asyncio.to_thread(fleet4.kill, flapper_i, signal.SIGKILL)
            ejects.append(await timeline.wait(t_down, lambda h: h.get(flapper) == 0,
                                              GIVE_UP, "ejection of the flapping replica"))
            await asyncio.sleep(max(0.0, t_down + down - time.monotonic()))
            await asyncio.to_thread(fleet4.restart, flapper_i)
            t_up = time.monotonic()
            readmits.append(await timeline.wait(t_up, lambda h: h.get(flapper) == 1,
                                                GIVE_UP, "re-admission after the flap"))
            await asyncio.sleep(max(0.0, t_up + up - time.monotonic()))
        stop_load.set()
        outcomes = await load
        stop_tl.set()
        await poller
        return dict(outcomes=outcomes, ejects=ejects, readmits=readmits)

    r = asyncio.run(scenario())
    outcomes: list[Outcome] = r["outcomes"]
    samples = router.samples()
    measure("chaos_flap", **summary(outcomes), cycles=cycles,
            eject_seconds=[round(x, 3) for x in r["ejects"]],
            readmit_seconds_after_restart=[round(x, 3) for x in r["readmits"]],
            ejections=metric(samples, "prefix_router_ejections_total", replica=flapper),
            retries=metric(samples, "prefix_router_retries_total"))
    assert non_streamed_failures(outcomes) == []
    assert stream_failures(outcomes) == []
    promise(measure, "chaos_flap", "eject_max", max(r["ejects"]), EJECT_WITHIN)
    promise(measure, "chaos_flap", "readmit_max", max(r["readmits"]), READMIT_WITHIN)
    assert metric(samples, "prefix_router_ejections_total", replica=flapper) >= cycles
    assert metric(samples, "prefix_router_replica_healthy", replica=flapper) == 1


def test_all_down_then_back(fleet4: Fleet, start_router: Callable[..., RouterProcess],
                            measure: Callable[..., None]) -> None:
    router = chaos_router(start_router, fleet4)

    async def scenario() -> dict[str, Any]:
        for i in range(len(fleet4)):
            await asyncio.to_thread(fleet4.kill, i, signal.SIGKILL)
        t_down = time.monotonic()
        async with aiohttp.ClientSession() as session:
            down = [await one(session, router.url, k % KEYS, stream=k % 2 == 0, client_timeout=10)
                    for k in range(scaled(60))]
            await asyncio.gather(*(asyncio.to_thread(fleet4.restart, i)
                                   for i in range(len(fleet4))))
            t_up = time.monotonic()
            recovered: float | None = None
            while time.monotonic() - t_up < GIVE_UP:
                o = await one(session, router.url, 0, stream=False, client_timeout=10)
                if o.kind == "ok":
                    recovered = time.monotonic() - t_up
                    break
                await asyncio.sleep(0.05)
            after = [await one(session, router.url, k % KEYS, stream=k % 2 == 0)
                     for k in range(scaled(40))]
        return dict(down=down, after=after, recovered=recovered, t_down=t_down)

    r = asyncio.run(scenario())
    down: list[Outcome] = r["down"]
    measure("chaos_all_down", sent_while_down=len(down),
            statuses_while_down=dict(Counter(o.status for o in down)),
            slowest_503_seconds=round(max(o.seconds for o in down), 3),
            recovered_seconds_after_restart=r["recovered"],
            sent_after=len(r["after"]),
            ok_after=sum(o.kind == "ok" for o in r["after"]))
    assert {o.status for o in down} == {503}
    assert all(o.retry_after and int(o.retry_after) >= 1 for o in down)
    # fast answers, not timeouts: every 503 came from the router's own state (no replica to try)
    promise(measure, "chaos_all_down", "slowest_503", max(o.seconds for o in down), 2.0)
    assert r["recovered"] is not None
    promise(measure, "chaos_all_down", "recovered", r["recovered"], READMIT_WITHIN)
    assert all(o.kind == "ok" for o in r["after"])


def test_stream_dying_before_first_chunk_is_retried(
        start_fleet: Callable[..., Fleet], start_router: Callable[..., RouterProcess]) -> None:
    fleet = start_fleet(2, speed=50.0)
    router = chaos_router(start_router, fleet)

    async def scenario() -> list[Outcome]:
        assert len(await fill(router.url, len(fleet.names), first_key=KEYS)) == len(fleet.names)
        home = await placement(router.url, KEYS)
        keys = [k for k, name in home.items() if name == fleet.names[0]][:5]
        assert keys
        # headers, then an abrupt close before the first chunk: vLLM's shape when it dies
        # during prefill
        await asyncio.to_thread(fleet.fault, 0, stop_after=0)
        async with aiohttp.ClientSession() as session:
            return [await one(session, router.url, k, stream=True) for k in keys]

    outcomes = asyncio.run(scenario())
    assert [(o.kind, o.status, o.replica) for o in outcomes] == \
        [("ok", 200, fleet.names[1])] * len(outcomes)


class Blackhole:
    """A loopback listener whose accept queue is full: the kernel drops further SYNs, so a
    connect to it times out (a replica whose host vanished, without leaving 127.0.0.1)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.port = self.sock.getsockname()[1]
        self.fillers = []
        for _ in range(4):   # fill the queue; the next connects stay in SYN_SENT
            c = socket.socket()
            c.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                c.connect(("127.0.0.1", self.port))
            self.fillers.append(c)
        time.sleep(0.1)

    def close(self) -> None:
        for c in self.fillers:
            c.close()
        self.sock.close()


def test_connect_timeout_is_retried(start_fleet: Callable[..., Fleet],
                                    start_router: Callable[..., RouterProcess]) -> None:
    fleet = start_fleet(1, speed=50.0)
    hole = Blackhole()
    try:
        cfg = router_config([f"http://127.0.0.1:{hole.port}", fleet.urls[0]], ["hole", "sim-0"],
                            proxy={"connect_timeout": 0.3},
                            health={"interval": 30.0, "readmit_backoff": 30.0,
                                    "readmit_backoff_max": 30.0, "eject_after": 100})
        router = start_router(cfg)

        async def scenario() -> list[Outcome]:
            async with aiohttp.ClientSession() as session:
                return [await one(session, router.url, k, stream=k % 2 == 0)
                        for k in range(8)]

        outcomes = asyncio.run(scenario())
    finally:
        hole.close()
    assert [(o.kind, o.status, o.replica) for o in outcomes] == \
        [("ok", 200, "sim-0")] * len(outcomes)
