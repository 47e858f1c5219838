"""router.peers.service over real ZMQ (ipc:// in a temporary directory, tcp:// on 127.0.0.1):
a request one process routes is queued work and in-flight prefix in the other's routing state
until it ends; echoes, malformed messages and silent peers change nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from loadtest._net import quiet_port
from router.discovery.base import Endpoint
from router.metrics import RouterMetrics
from router.peers.service import PeerService, bind_endpoints, peer_endpoints, sibling_endpoints
from router.replicas import ReplicaSet
from router.routing import Router
from router.settings import PeersSettings, Settings

CHAT = "/v1/chat/completions"
SYSTEM = "You answer questions about the billing system. " * 40


def body(q: str) -> dict[str, Any]:
    return {"model": "m", "stream": True,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]}


@pytest.mark.parametrize(("peers", "workers", "addresses", "own", "expected"), [
    # static endpoints only; this process's own bind left out
    (PeersSettings(endpoints=("tcp://a:1", "tcp://b:1")), 1, (), "tcp://a:1", {"tcp://b:1"}),
    # two workers on a wildcard host: the sibling at 127.0.0.1, not this worker's own port
    (PeersSettings(host="0.0.0.0", port=7000), 2, (), "tcp://0.0.0.0:7000",
     {"tcp://127.0.0.1:7001"}),
    # a specific host is where the siblings are
    (PeersSettings(host="10.1.2.3", port=7000), 2, (), "tcp://10.1.2.3:7001",
     {"tcp://10.1.2.3:7000"}),
    # DNS addresses (a headless Service: this pod among them) at every worker's port, IPv6 too
    (PeersSettings(port=7000), 2, ("10.0.0.5", "fd00::7"), None,
     {"tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001", "tcp://10.0.0.5:7000",
      "tcp://10.0.0.5:7001", "tcp://[fd00::7]:7000", "tcp://[fd00::7]:7001"}),
])
def test_peer_endpoints(peers: PeersSettings, workers: int, addresses: tuple[str, ...],
                        own: str | None, expected: set[str]) -> None:
    assert peer_endpoints(peers, workers, addresses, own) == expected


def test_bind_endpoints() -> None:
    assert bind_endpoints(PeersSettings(port=7000), 1) == ["tcp://127.0.0.1:7000"]
    assert bind_endpoints(PeersSettings(host="::", port=7000), 2) == \
        ["tcp://[::]:7000", "tcp://[::]:7001"]
    assert bind_endpoints(PeersSettings(bind="ipc:///x"), 1) == ["ipc:///x"]


async def until(check: Callable[[], bool], what: str, tries: int = 500) -> None:
    for _ in range(tries):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def service(bind: str, endpoints: list[str], **peers: Any) -> PeerService:
    settings = Settings.from_dict({
        "replicas": [{"name": f"r{i}", "url": f"http://127.0.0.1:{9100 + i}"} for i in range(4)],
        "routing": {"policy": "cache_aware", "peers": {
            "enabled": True, "bind": bind, "endpoints": endpoints, "heartbeat": 0.05,
            "timeout": 0.5, **peers}}})
    rs = ReplicaSet([Endpoint(r.name, r.url) for r in settings.replicas])
    return PeerService(settings, Router(settings.routing, rs), RouterMetrics())


def sample(svc: PeerService, name: str, **labels: str) -> float:
    return svc.metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_routed_request_is_in_flight_at_the_peer_until_it_ends(tmp_path: Path) -> None:
    a_ep, b_ep = f"ipc://{tmp_path}/a", f"ipc://{tmp_path}/b"
    # each subscribes to both endpoints: its own echo must be dropped unread
    a, b = service(a_ep, [a_ep, b_ep]), service(b_ep, [a_ep, b_ep])

    async def run() -> None:
        await a.start()
        await b.start()
        try:
            assert a.connected == {b_ep} and b.connected == {a_ep}
            await until(lambda: a.me in b.state.peers() and b.me in a.state.peers(),
                        "each to hear the other's hello")
            routed = a.state.router.route(CHAT, {}, body("q1"), 1)
            assert routed is not None
            name = routed.decision.replica
            ra, rb = a.state.router.replicas.get(name), b.state.router.replicas.get(name)
            assert ra is not None and rb is not None
            routed.started(ra)
            await until(lambda: rb.peer_in_flight == 1, "A's attempt at B")
            assert rb.pending_prefill == ra.pending_prefill > 0
            # B's decision for the same prompt: predicted cached where A is prefilling it
            same = b.state.router.route(CHAT, {}, body("q1"), 1)
            assert same is not None and same.decision.replica == name
            assert same.cached[name] > 0 and same.leader is not None
            routed.served(ra, 200)
            await until(lambda: rb.unstarted == 0, "A's first byte at B")
            assert not same.leader.prefilling
            index = b.state.router.index
            assert index is not None and index.match(routed.chunks)[name] > 0
            routed.ended(ra)
            await until(lambda: rb.peer_in_flight == 0, "A's end at B")
            assert len(b.state) == 0
            assert sample(b, "prefix_router_peer_events_received_total", type="start",
                          applied="true") == 1
            assert sample(a, "prefix_router_peer_events_sent_total", type="ended") == 1
            assert sample(b, "prefix_router_peer_mirror_lag_seconds_count") >= 3
            assert a.state.ignored == 0 and b.state.ignored == 0  # no echo was applied
            await until(lambda: sample(b, "prefix_router_peer_connected") == 1,
                        "B's status gauge")
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(run())


def test_malformed_messages_are_counted_and_skipped(tmp_path: Path) -> None:
    rogue_ep, b_ep = f"ipc://{tmp_path}/rogue", f"ipc://{tmp_path}/b"
    b = service(b_ep, [rogue_ep])

    async def run() -> None:
        ctx = zmq.asyncio.Context()
        rogue = ctx.socket(zmq.PUB)
        rogue.bind(rogue_ep)
        await b.start()
        try:
            junk = [[b"x"], [b"p", b"\xc1"], [b"p", b"\x93\x01\x02\x03"], [b"a", b"b", b"c"]]
            # PUB drops everything until the subscription arrived: send until B counts one
            for _ in range(200):
                await rogue.send_multipart(junk[0])
                await asyncio.sleep(0.01)
                if b.decode_errors:
                    break
            before = b.decode_errors
            assert before > 0
            for frames in junk[1:]:
                await rogue.send_multipart(frames)
            await until(lambda: b.decode_errors == before + 3, "every junk message counted")
            assert sample(b, "prefix_router_peer_decode_errors_total") == before + 3
            assert len(b.state) == 0 and b.state.applied == 0
            assert all(not t.done() for t in b._tasks)  # the loops run on
        finally:
            await b.stop()
            rogue.close(0)
            ctx.destroy(0)

    asyncio.run(run())


def test_a_silent_peer_loses_its_attempts_and_tcp_workers_find_each_other() -> None:
    # two "workers" of one pod over tcp on 127.0.0.1: each binds the first free port of the
    # range and subscribes to the other by itself
    port = quiet_port(n=2)  # both below the ephemeral range: no outgoing connection takes them
    settings = Settings.from_dict({
        "workers": 2,
        "replicas": [{"name": f"r{i}", "url": f"http://127.0.0.1:{9100 + i}"} for i in range(4)],
        "routing": {"policy": "cache_aware", "peers": {
            "enabled": True, "port": port, "heartbeat": 0.05, "timeout": 0.3}}})

    def make() -> PeerService:
        rs = ReplicaSet([Endpoint(r.name, r.url) for r in settings.replicas])
        return PeerService(settings, Router(settings.routing, rs), RouterMetrics())

    a, b = make(), make()

    async def run() -> None:
        try:
            await a.start()  # inside: a failed start of b must still stop a (its context)
            await b.start()
            assert {a.bound, b.bound} == {f"tcp://127.0.0.1:{port}",
                                          f"tcp://127.0.0.1:{port + 1}"}
            await until(lambda: a.me in b.state.peers(), "B to hear A")
            routed = a.state.router.route(CHAT, {}, body("q2"), 1)
            assert routed is not None
            ra = a.state.router.replicas.get(routed.decision.replica)
            rb = b.state.router.replicas.get(routed.decision.replica)
            assert ra is not None and rb is not None
            routed.started(ra)
            await until(lambda: rb.peer_in_flight == 1, "A's attempt at B")
            await a.stop()  # A dies without ending its attempt
            await until(lambda: rb.peer_in_flight == 0, "A's attempt to expire at B")
            assert (rb.unstarted, rb.pending_prefill, len(b.state)) == (0, 0.0, 0)
            assert a.me not in b.state.peers()
            await until(lambda: sample(b, "prefix_router_peer_attempts_expired_total") == 1,
                        "the expiry counted")
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(run())


def test_a_taken_port_range_fails_start_up() -> None:
    port = quiet_port()
    a = service(f"tcp://127.0.0.1:{port}", [])
    b = service(f"tcp://127.0.0.1:{port}", [])

    async def run() -> None:
        await a.start()
        try:
            with pytest.raises(RuntimeError, match="cannot bind the peer socket"):
                await b.start()
        finally:
            await a.stop()

    asyncio.run(run())


def test_sibling_workers_claim_a_slot_each_and_subscribe_to_the_others(tmp_path: Path) -> None:
    # the workers of `serve --workers 2` without routing.peers: ipc sockets in the parent's
    # directory; a third process finds no slot; a slot freed by a stopped worker is taken again
    settings = Settings.from_dict({
        "workers": 2,
        "replicas": [{"name": f"r{i}", "url": f"http://127.0.0.1:{9100 + i}"} for i in range(4)],
        "routing": {"policy": "cache_aware", "peers": {"heartbeat": 0.05, "timeout": 0.5}}})
    assert settings.workers_share
    ends = sibling_endpoints(str(tmp_path), 2)
    assert ends == [f"ipc://{tmp_path}/0.sock", f"ipc://{tmp_path}/1.sock"]

    def make() -> PeerService:
        rs = ReplicaSet([Endpoint(r.name, r.url) for r in settings.replicas])
        return PeerService(settings, Router(settings.routing, rs), RouterMetrics(),
                           siblings=str(tmp_path))

    a, b, c = make(), make(), make()

    async def run() -> None:
        try:
            await a.start()
            await b.start()
            assert (a.bound, a.connected) == (ends[0], {ends[1]})
            assert (b.bound, b.connected) == (ends[1], {ends[0]})
            await until(lambda: a.me in b.state.peers() and b.me in a.state.peers(),
                        "the siblings to hear each other")
            with pytest.raises(RuntimeError, match=r"sibling slots .* are taken"):
                await c.start()
            assert c._ctx is None  # nothing was opened for the failed claim
            await a.stop()
            await c.start()  # a restarted worker takes the slot the stopped one left
            assert c.bound == ends[0]
            await until(lambda: c.me in b.state.peers(), "B to hear the new worker")
        finally:
            for s in (a, b, c):
                await s.stop()

    asyncio.run(run())
