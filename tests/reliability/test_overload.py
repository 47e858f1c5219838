"""Overload: a burst at ~10x what the fleet can serve, against a router with a small
``proxy.max_in_flight``.

The fleet is 2 simulated replicas with ``--max-num-seqs 2`` (about 20 short requests a second
between them); the burst is 64 concurrent clients that send without pause for a couple of
seconds. Expectations: the router never holds more than ``max_in_flight`` requests upstream
(sampled from its /metrics every 20 ms), the excess is answered 429/503 with Retry-After (not
queued without bound, not timed out), RSS stays bounded, and once the burst ends ordinary
requests succeed again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

import aiohttp
import pytest

from loadtest.fleet import Fleet
from tests.reliability.conftest import RouterProcess, metric, parse_metrics, router_config, scaled
from tests.reliability.load import Outcome, one, run_load, summary

pytestmark = pytest.mark.slow

MAX_IN_FLIGHT = 8
RSS_GROWTH_KIB = 50 * 1024


def test_burst_is_shed_and_service_resumes(start_fleet: Callable[..., Fleet],
                                           start_router: Callable[..., RouterProcess],
                                           measure: Callable[..., None]) -> None:
    fleet = start_fleet(2, max_num_seqs=2)
    router = start_router(router_config(fleet.urls, fleet.names,
                                        proxy={"max_in_flight": MAX_IN_FLIGHT,
                                               "first_byte_timeout": 30.0}))
    rss_before = router.rss_kib()

    async def scenario() -> dict[str, object]:
        peak_in_flight, peak_rss = 0.0, rss_before
        stop = asyncio.Event()

        async def sample() -> None:
            nonlocal peak_in_flight, peak_rss
            async with aiohttp.ClientSession() as session:
                while not stop.is_set():
                    async with session.get(router.metrics_url) as r:
                        s = parse_metrics(await r.text())
                    peak_in_flight = max(peak_in_flight, metric(s, "prefix_router_in_flight"))
                    peak_rss = max(peak_rss, router.rss_kib())
                    await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample())
        t0 = time.monotonic()
        burst = await run_load(router.url, count=scaled(3000), duration=3.0, concurrency=64,
                               keys=64, max_tokens=16)
        burst_seconds = time.monotonic() - t0
        stop.set()
        await sampler
        async with aiohttp.ClientSession() as session:
            after = [await one(session, router.url, k, stream=k % 2 == 0, max_tokens=16)
                     for k in range(scaled(20))]
        return dict(burst=burst, after=after, peak_in_flight=peak_in_flight, peak_rss=peak_rss,
                    burst_seconds=burst_seconds)

    r = asyncio.run(scenario())
    burst: list[Outcome] = r["burst"]  # type: ignore[assignment]
    after: list[Outcome] = r["after"]  # type: ignore[assignment]
    shed = [o for o in burst if o.status in (429, 503)]
    served = [o for o in burst if o.kind == "ok"]
    rss_after = router.rss_kib()
    measure("overload", **summary(burst), burst_seconds=round(float(r["burst_seconds"]), 2),  # type: ignore[arg-type]
            served_per_second=round(len(served) / float(r["burst_seconds"]), 1),  # type: ignore[arg-type]
            shed=len(shed), shed_ratio=round(len(shed) / max(1, len(burst)), 3),
            slowest_shed_ms=round(max((o.seconds for o in shed), default=0.0) * 1000, 1),
            max_in_flight=MAX_IN_FLIGHT, peak_in_flight=r["peak_in_flight"],
            rss_kib_before=rss_before, rss_kib_peak=r["peak_rss"], rss_kib_after=rss_after,
            ok_after=sum(o.kind == "ok" for o in after), sent_after=len(after))
    assert {o.kind for o in burst} <= {"ok", "status"}, Counter(o.kind for o in burst)
    assert {o.status for o in burst} <= {200, 429, 503}
    assert len(shed) > len(served)          # it really was an overload
    assert all(o.retry_after and int(o.retry_after) >= 1 for o in shed)
    assert r["peak_in_flight"] <= MAX_IN_FLIGHT  # type: ignore[operator]
    assert int(r["peak_rss"]) - rss_before < RSS_GROWTH_KIB  # type: ignore[call-overload]
    assert [o for o in after if o.kind != "ok"] == []
