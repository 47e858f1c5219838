"""Fault injection, one test per mode, via flags and via the loopback admin endpoint."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from loadtest.fleet import Fleet
from loadtest.replica import Replica, ReplicaConfig
from loadtest.replica.timing import TimingModel
from tests.conftest import wait_for

HTTP = httpx.Client(timeout=30)
BODY = {"prompt": list(range(40)), "max_tokens": 8}


@pytest.fixture
def sim(threaded_server: Callable[..., Any]) -> Callable[..., str]:
    def start(**options: Any) -> str:
        options.setdefault("speed", 50.0)
        return str(threaded_server(Replica(ReplicaConfig(**options))).url)

    return start


def complete(url: str, **extra: Any) -> httpx.Response:
    return HTTP.post(url + "/v1/completions", json={**BODY, **extra})


def set_fault(url: str, **spec: Any) -> httpx.Response:
    return HTTP.post(url + "/admin/fault", json=spec)


def test_error_status_from_flags(sim: Callable[..., str]) -> None:
    url = sim(fault_error_rate=1.0, fault_error_status=503)
    r = complete(url)
    assert r.status_code == 503 and r.headers["x-replica-name"] == "sim-0"
    assert HTTP.get(url + "/health").status_code == 200   # only inference requests fail


def test_error_fraction_and_clear_via_admin(sim: Callable[..., str]) -> None:
    url = sim(seed=7)
    assert set_fault(url, error_rate=0.5, error_status=500).status_code == 200
    statuses = [complete(url, max_tokens=1).status_code for _ in range(40)]
    assert set(statuses) == {200, 500}
    assert 8 <= statuses.count(500) <= 32
    assert HTTP.delete(url + "/admin/fault").status_code == 200
    assert all(complete(url, max_tokens=1).status_code == 200 for _ in range(5))


def test_hang_accepts_and_never_answers(sim: Callable[..., str]) -> None:
    url = sim()
    set_fault(url, hang_rate=1.0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/completions", json=BODY, timeout=0.5)
    wait_for(lambda: HTTP.get(url + "/admin/stats").json()["aborts"] == 1, "the hang's abort")
    assert HTTP.get(url + "/admin/stats").json()["in_flight"] == 0


def test_hang_is_visible_in_flight_while_it_lasts(sim: Callable[..., str]) -> None:
    url = sim(fault_hang_rate=1.0)

    async def main() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=30) as client:
            pending = asyncio.ensure_future(client.post(url + "/v1/completions", json=BODY))
            for _ in range(300):
                stats = (await client.get(url + "/admin/stats")).json()
                if stats["in_flight"]:
                    break
                await asyncio.sleep(0.02)
            pending.cancel()
            return dict(stats)

    stats = asyncio.run(main())
    assert stats["in_flight"] == 1 and stats["in_flight_ids"][0].startswith("cmpl-sim-0-")


def test_slow_factor_stretches_the_timing_model(sim: Callable[..., str]) -> None:
    url = sim(speed=20.0)
    body = {"prompt": list(range(300)), "max_tokens": 30}

    def timed() -> float:
        t0 = time.perf_counter()
        assert complete(url, **body).status_code == 200
        return time.perf_counter() - t0

    timed()
    set_fault(url, slow=20.0)
    slow = timed()
    # a lower bound the model sets (load only adds to it): a prefill step (the prompt is cached
    # by now, so count none of its tokens) and 29 one-sequence decode steps, each 20x: 0.31 s,
    # where the unslowed request models at 16 ms
    model = TimingModel(speed=20.0)
    assert slow >= model.step_seconds(0, 0, slow=20.0) + 29 * model.step_seconds(0, 1, slow=20.0)


@pytest.mark.parametrize("instant", [False, True])
def test_stop_after_k_chunks_cuts_the_stream(sim: Callable[..., str], instant: bool) -> None:
    url = sim(fault_stop_after=3, instant=instant)
    events: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError), HTTP.stream(
            "POST", url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
                  "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                events.append(line)
    assert len(events) == 3 and "data: [DONE]" not in events


def test_stop_after_truncates_a_non_streamed_body(sim: Callable[..., str]) -> None:
    url = sim()
    set_fault(url, stop_after=0)
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(url + "/v1/completions", json=BODY, timeout=10)


def test_health_status_fault(sim: Callable[..., str]) -> None:
    url = sim()
    set_fault(url, health_status=503)
    assert HTTP.get(url + "/health").status_code == 503
    assert complete(url).status_code == 200          # only the probe fails
    HTTP.delete(url + "/admin/fault")
    assert HTTP.get(url + "/health").status_code == 200


def test_bad_fault_spec_is_rejected(sim: Callable[..., str]) -> None:
    url = sim()
    assert set_fault(url, explode=True).status_code == 400
    assert set_fault(url, error_rate=2).status_code == 400
    # refusing needs control of the listening socket, which an in-thread server lacks
    assert set_fault(url, refuse=True).status_code == 501


def call_app(replica: Replica, path: str, client: str, server_port: int = 8000) -> int:
    """Drive the ASGI app directly with a chosen peer address; the response status."""
    sent: list[dict[str, Any]] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: Any) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": "GET", "path": path, "headers": [],
             "client": (client, 5555), "server": ("127.0.0.1", server_port)}
    asyncio.run(replica(scope, receive, send))
    return int(sent[0]["status"])


@pytest.mark.parametrize(("host", "admin_port", "peer", "port", "status"), [
    ("127.0.0.1", None, "127.0.0.1", 8000, 200),   # loopback listener, loopback peer
    ("127.0.0.1", None, "::1", 8000, 200),
    ("127.0.0.1", None, "10.1.2.3", 8000, 403),    # a remote peer is refused
    ("0.0.0.0", None, "127.0.0.1", 8000, 404),     # public listener: no admin at all
    ("0.0.0.0", 9001, "127.0.0.1", 8000, 404),     # ... not even with an admin port elsewhere
    ("0.0.0.0", 9001, "127.0.0.1", 9001, 200),     # the loopback admin listener serves it
    ("0.0.0.0", 9001, "192.168.0.9", 9001, 403),
])
def test_admin_is_loopback_only(host: str, admin_port: int | None, peer: str, port: int,
                                status: int) -> None:
    replica = Replica(ReplicaConfig(host=host, admin_port=admin_port))
    assert call_app(replica, "/admin/stats", peer, port) == status


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet(replicas=2, speed=50.0) as f:
        yield f


def test_refuse_connections_and_reopen(fleet: Fleet) -> None:
    url = fleet.urls[0]
    with httpx.Client(timeout=5) as keep:
        assert keep.get(url + "/health").status_code == 200     # an open keep-alive connection
        fleet.fault(0, refuse=True)
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
        assert keep.get(url + "/health").status_code == 200     # accepted connections live on
        assert fleet.stats(0)["faults"]["refuse"] is True       # admin port still answers
    fleet.clear_fault(0)
    wait_for(lambda: _healthy(url), "the listener to reopen")


def test_refuse_for_a_while_reopens_by_itself(fleet: Fleet) -> None:
    url = fleet.urls[1]
    fleet.fault(1, refuse=True, refuse_seconds=0.5)
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=2)
    wait_for(lambda: _healthy(url), "the listener to reopen", tries=500)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_exit_now_and_exit_after_n_requests(fleet: Fleet) -> None:
    fleet.fault(0, exit=True, exit_code=3)
    wait_for(lambda: not fleet.alive(0), "the exit", tries=500)
    assert fleet.returncode(0) == 3
    fleet.restart(0)
    fleet.fault(0, exit_after=2, exit_code=4)
    assert complete(fleet.urls[0]).status_code == 200
    with pytest.raises(httpx.HTTPError):
        httpx.post(fleet.urls[0] + "/v1/completions", json=BODY, timeout=5)
    wait_for(lambda: not fleet.alive(0), "the exit", tries=500)
    assert fleet.returncode(0) == 4
    fleet.restart(0)
    assert _healthy(fleet.urls[0])
