"""routing.peers end to end: two router apps on real uvicorn servers and real ZMQ sockets (tcp on
127.0.0.1), in front of fake replicas. A request router A is prefilling shows up in router B's
in-flight view, and B's decision for the same prompt waits for it on the same replica instead
of prefilling the prompt a second time; without peers B knows nothing of it.

Waits are bounded polls on state, never sleeps that assume a speed.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtest._net import quiet_port
from router.app import RouterApp
from tests.conftest import wait_for
from tests.integration.conftest import router_settings

SYSTEM = "You are the support assistant of the ACME billing platform. " * 40  # ~600 tokens


def body(q: str) -> dict[str, Any]:
    return {"model": "fake-model", "stream": True, "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]}


def held(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=5).text
    return {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "prefix_router_hold_seconds_count"}


def sample(app: RouterApp, name: str, **labels: str) -> float:
    return app.metrics.registry.get_sample_value(name, labels) or 0.0


def _pair(fake_fleet: Any, router_server: Any, peers: bool) -> tuple[Any, Any, Any, Any, Any]:
    fleet = fake_fleet(3)
    pa, pb = quiet_port(), quiet_port()  # below the ephemeral range: stay free until bound

    def settings(own: int, other: int) -> Any:
        return router_settings(fleet.urls, routing={
            "policy": "cache_aware", "hold_timeout": 60,
            "peers": {"enabled": peers, "port": own, "endpoints": [f"tcp://127.0.0.1:{other}"],
                      "heartbeat": 0.1}})

    sa, a = router_server(settings(pa, pb))
    sb, b = router_server(settings(pb, pa))
    return fleet, sa, a, sb, b


def _slow_request_through(url: str, done: list[str]) -> threading.Thread:
    def run() -> None:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body("first"),
                          headers={"x-fake-delay": "4"}, timeout=30) as resp:
            done.append(resp.headers["x-prefix-router-replica"])
            resp.read()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_peers_prefill_holds_the_same_prompt_here(fake_fleet: Any, router_server: Any) -> None:
    fleet, sa, a, sb, b = _pair(fake_fleet, router_server, peers=True)
    assert a.peers is not None and b.peers is not None
    wait_for(lambda: a.peers.me in b.peers.state.peers() and b.peers.me in a.peers.state.peers(),
             "the routers to hear each other")
    answered: list[str] = []
    slow = _slow_request_through(sa.url, answered)
    # A's attempt is in B's view: queued work, one peer attempt and the prompt in flight
    wait_for(lambda: any(s.peer_in_flight for s in b.replicas.states()), "A's attempt at B")
    name = next(s.name for s in b.replicas.states() if s.peer_in_flight)
    state = b.replicas.get(name)
    assert state is not None and state.pending_prefill > 0 and state.in_flight == 0
    # the same prompt through B: held behind A's prefill, then sent to the same replica
    resp = httpx.post(sb.url + "/v1/chat/completions", json=body("second"), timeout=30)
    assert resp.status_code == 200
    assert resp.headers["x-prefix-router-replica"] == name
    slow.join(30)
    assert answered == [name]
    assert held(sb.url) == {"answered": 1.0}
    # A's first byte recorded the prompt in B's index; its end released everything
    wait_for(lambda: state.peer_in_flight == 0, "A's end at B")
    assert (state.unstarted, state.pending_prefill) == (0, 0.0)
    assert sample(b, "prefix_router_peer_events_received_total", type="served",
                  applied="true") == 1
    assert sample(a, "prefix_router_peer_events_received_total", type="start",
                  applied="true") == 1  # B's own request, mirrored at A
    assert fleet.by_name(name).requests and sum(fleet.counts().values()) == 2


def test_without_peers_the_other_router_knows_nothing(fake_fleet: Any,
                                                      router_server: Any) -> None:
    fleet, sa, a, sb, b = _pair(fake_fleet, router_server, peers=False)
    assert a.peers is None and b.peers is None
    answered: list[str] = []
    slow = _slow_request_through(sa.url, answered)
    wait_for(lambda: sum(len(r.requests) for r in fleet.replicas) == 1, "A's request upstream")
    assert not any(s.peer_in_flight or s.pending_prefill for s in b.replicas.states())
    resp = httpx.post(sb.url + "/v1/chat/completions", json=body("second"), timeout=30)
    assert resp.status_code == 200
    slow.join(30)
    assert held(sb.url) == {}  # B dispatched at once: it would prefill the prompt again
