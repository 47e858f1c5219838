"""router.peers.state: another router process's attempts weigh as this process's own."""

from __future__ import annotations

from typing import Any

from router.discovery.base import Endpoint
from router.peers import Outbox, PeerEvent, PeerState
from router.replicas import ReplicaSet
from router.routing import Router
from router.settings import Settings

CHAT = "/v1/chat/completions"


def router(**routing: Any) -> Router:
    rs = ReplicaSet([Endpoint(f"r{i}", f"http://127.0.0.1:{9100 + i}") for i in range(4)])
    return Router(Settings.from_dict({"routing": {"policy": "cache_aware", **routing}}).routing,
                  rs)


def body(q: str, system: str = "You answer questions about the billing system. " * 40
         ) -> dict[str, Any]:
    return {"model": "m", "stream": True,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def pair(ttl: float = 30.0, timeout: float = 5.0) -> tuple[Router, Router, PeerState,
                                                           list[PeerEvent], Clock]:
    a, b = router(), router()
    sent: list[PeerEvent] = []
    clock = Clock()
    a.outbox = Outbox("A", sent.append, clock=clock)
    return a, b, PeerState(b, ttl, timeout, clock=clock, me="B"), sent, clock


def test_a_peers_dispatch_is_queued_work_and_in_flight_chunks_here_until_it_answers() -> None:
    a, b, peers, sent, _ = pair()
    routed = a.route(CHAT, {}, body("q1"), 1)
    assert routed is not None
    name = routed.decision.replica
    sa, sb = a.replicas.get(name), b.replicas.get(name)
    assert sa is not None and sb is not None
    routed.started(sa)
    assert [e.kind for e in sent] == ["start"]
    assert peers.apply(sent[-1])
    # B now counts A's predicted prefill, its unstarted request and its attempt on that replica
    assert sb.pending_prefill == sa.pending_prefill == routed.prompt_tokens
    assert (sb.unstarted, sb.peer_in_flight, sb.in_flight) == (1, 1, 0)
    assert sb.load() == 1.0
    assert b.in_flight.match(routed.chunks) == {name: routed.chunks.tokens[-1]}
    # the same request at B is predicted cached where A is prefilling it; B holds it behind A's
    same = b.route(CHAT, {}, body("q1"), 2)
    assert same is not None and same.decision.replica == name
    assert same.cached[name] == routed.chunks.tokens[-1]
    assert same.leader is not None and same.leader.prefilling
    routed.served(sa, 200)
    assert peers.apply(sent[-1])
    assert not same.leader.prefilling  # the held request is released by A's first byte
    assert (sb.unstarted, sb.pending_prefill, sb.peer_in_flight) == (0, 0.0, 1)
    assert b.index is not None and b.index.match(routed.chunks)[name] > 0  # recorded as cached
    routed.ended(sa)
    assert peers.apply(sent[-1]) and sb.peer_in_flight == 0 and len(peers) == 0
    assert [e.kind for e in sent] == ["start", "served", "ended"]


def test_a_failed_peer_attempt_leaves_nothing_and_indexes_nothing() -> None:
    a, b, peers, sent, _ = pair()
    routed = a.route(CHAT, {}, body("q2"), 1)
    assert routed is not None
    sa = a.replicas.get(routed.decision.replica)
    assert sa is not None
    routed.started(sa)
    routed.served(sa, 503)
    routed.ended(sa)
    for e in sent:
        peers.apply(e)
    sb = b.replicas.get(routed.decision.replica)
    assert sb is not None
    assert (sb.unstarted, sb.pending_prefill, sb.peer_in_flight) == (0, 0.0, 0)
    assert b.index is not None and b.index.match(routed.chunks) == {}
    assert len(b.in_flight) == 0


def test_attempts_expire_after_the_ttl_and_with_a_silent_peer() -> None:
    a, b, peers, sent, clock = pair(ttl=10.0, timeout=3.0)
    routed = a.route(CHAT, {}, body("q3"), 1)
    assert routed is not None
    sa = a.replicas.get(routed.decision.replica)
    sb = b.replicas.get(routed.decision.replica)
    assert sa is not None and sb is not None
    routed.started(sa)
    peers.apply(sent[-1])
    box = a.outbox
    assert isinstance(box, Outbox)
    for _ in range(4):  # the peer keeps talking (heartbeats) but never ends this attempt
        clock.t += 2.0
        box.hello()
        peers.apply(sent[-1])
    assert peers.expire() == 0 and sb.peer_in_flight == 1
    clock.t += 2.5  # 10.5 s after its start
    assert peers.expire() == 1
    assert (sb.unstarted, sb.pending_prefill, sb.peer_in_flight, len(b.in_flight)) == \
        (0, 0.0, 0, 0)
    # a late end of the expired attempt changes nothing
    routed.ended(sa)
    assert not peers.apply(sent[-1]) and sb.peer_in_flight == 0
    # a peer that goes silent loses its attempts after ``timeout``
    again = a.route(CHAT, {}, body("q4"), 2)
    assert again is not None
    again.started(sa)
    peers.apply(sent[-1])
    assert sb.peer_in_flight == 1
    clock.t += 3.5
    assert peers.expire() == 1 and sb.peer_in_flight == 0 and peers.peers() == {}


def test_duplicates_unknown_attempts_replicas_and_own_echoes_are_ignored() -> None:
    a, b, peers, sent, _ = pair()
    routed = a.route(CHAT, {}, body("q5"), 1)
    assert routed is not None
    sa = a.replicas.get(routed.decision.replica)
    assert sa is not None
    routed.started(sa)
    start = sent[-1]
    assert peers.apply(start)
    assert not peers.apply(start)  # duplicate
    assert not peers.apply(start._replace(replica="nope"))  # not in this membership
    assert not peers.apply(start._replace(peer="B", rid=99))  # this process's own event
    assert not peers.apply(PeerEvent("served", "A", 12345, start.replica))
    assert not peers.apply(PeerEvent("bogus", "A", 1))
    sb = b.replicas.get(start.replica)
    assert sb is not None and sb.peer_in_flight == 1 and peers.ignored == 5
    assert peers.forget_replica(start.replica) == 1 and sb.peer_in_flight == 0


def test_a_mirrored_attempt_publishes_nothing() -> None:
    a, b, peers, sent, _ = pair()
    b_sent: list[PeerEvent] = []
    b.outbox = Outbox("B", b_sent.append)
    routed = a.route(CHAT, {}, body("q6"), 1)
    assert routed is not None
    sa = a.replicas.get(routed.decision.replica)
    assert sa is not None
    routed.started(sa)
    routed.served(sa, 200)
    routed.ended(sa)
    for e in sent:
        peers.apply(e)
    assert b_sent == []
