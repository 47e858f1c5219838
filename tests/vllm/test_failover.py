"""SIGKILL one real replica under load: no non-streamed request is lost.

Non-streamed responses reach the client only once complete, so every request the dead replica
held (connection reset) or would have received (connection refused) is still before its first
byte and the router retries it on the survivor. Runs last in the stage (`RUN_LAST`): the fleet
fixture restarts the killed replica only if another test needs it afterwards.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import httpx
import pytest

from loadtest.vllm_fleet import VllmFleet, parse_metrics

from ._prompts import chat

if TYPE_CHECKING:
    from .conftest import RouterUnderTest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
RUN_LAST = True

REQUESTS = 12
MAX_TOKENS = 96  # long enough that the kill lands mid-generation on a fast CI machine


def test_killing_a_replica_loses_no_unstreamed_request(
    fleet: VllmFleet, router: RouterUnderTest, unique: str
) -> None:
    limits = httpx.Limits(max_connections=REQUESTS, max_keepalive_connections=REQUESTS)
    http = httpx.Client(base_url=router.url, timeout=180, limits=limits)  # built once: threads
    # that each built a client (an SSL context apiece) dispatched seconds apart on a busy machine

    def send(k: int) -> tuple[int, str, int]:
        body = {
            "model": "tiny-llama",
            "messages": chat(f"{unique}-{k}", "answer briefly"),
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
        }
        resp = http.post("/v1/chat/completions", json=body)
        tokens = resp.json()["usage"]["completion_tokens"] if resp.status_code == 200 else -1
        return resp.status_code, resp.headers.get("x-prefix-router-replica", ""), tokens

    t0 = time.monotonic()
    with http, ThreadPoolExecutor(REQUESTS) as pool:
        futures = [pool.submit(send, k) for k in range(REQUESTS)]
        # Kill the replica the router has the most requests open on, once every request is open
        # or as soon as one has finished (a slow start must not let the victim drain first). The
        # router's own count is exact; vLLM's running gauge can trail the requests it counts (CI
        # once killed a replica that had already answered everything).
        counts = [0] * fleet.n
        for _ in range(600):  # bounded: 30 s
            states = [router.app.replicas.get(name) for name in fleet.names]
            counts = [s.in_flight if s is not None else 0 for s in states]
            if sum(counts) == REQUESTS or (max(counts) and any(f.done() for f in futures)):
                break
            time.sleep(0.05)
        victim = max(range(fleet.n), key=counts.__getitem__)
        held = counts[victim]
        assert held >= 1, f"no request open on any replica: {counts}"
        t_kill = time.monotonic() - t0
        fleet.kill(victim)
        results = [f.result() for f in futures]

    statuses = [r[0] for r in results]
    assert statuses == [200] * REQUESTS, results
    assert all(r[2] == MAX_TOKENS for r in results), results
    served_by = {r[1] for r in results}
    survivor = fleet.names[1 - victim]
    retries = parse_metrics(router.app.metrics.render()[0].decode())
    retried = retries.get("prefix_router_retries_total", 0)
    print(
        f"\nkilled {fleet.names[victim]} holding {held} at {t_kill:.2f}s, all done at"
        f" {time.monotonic() - t0:.2f}s; answers from {sorted(served_by)}; retries {retried:.0f}"
    )
    assert survivor in served_by
    assert retried >= 1, "the kill hit no request: nothing exercised the retry path"
