"""Peer routing state: the other router processes' in-flight requests, applied locally. Pure.

Events (`PeerEvent`), published by a process for each attempt of each request it routes
(`Outbox`, called from `router.routing.Routed`'s outcome hooks):

- ``start`` - an attempt was dispatched to ``replica``: the request's chunks (approximate
  chunk hashes and, with precise routing, its exact block keys), the prefill tokens the
  publisher predicted there, whether it streams and whether it is a conversation's first turn;
- ``served`` - that attempt's response started (``status``): its prompt is in the replica's
  KV cache;
- ``ended`` - the attempt ended (completed, failed or cancelled);
- ``hello`` - a heartbeat, so a subscriber knows the peer is alive.

`PeerState.apply` mirrors a peer's attempt as a `router.routing.Routed` of this process
(`Router.mirror`) and drives it through the same outcome hooks the proxy drives a local one
through: ``start`` adds its predicted prefill to the replica's queued work, its chunks to the
in-flight set (matched as cached there; a local request may be held behind it) and its dispatch
to the recent/share counts, and counts it in ``ReplicaState.peer_in_flight``; ``served``
releases the queued work and records the chunks in the index (approximate entries and, with
precise routing, speculative entries of ``kv_events.speculative_ttl``); ``ended`` releases
whatever is left. So a peer's decision weighs exactly as if this process had made it.

Expiry: every mirrored attempt ends by itself ``ttl`` seconds after its ``start`` arrived
(`expire`), and every attempt of a peer ends when that peer has been silent for ``timeout``
seconds (`expire` with the heartbeat's last arrival), so a dead or partitioned peer cannot pin
stale load. A duplicate ``start``, or a ``served``/``ended`` for an attempt this process never
saw (lost, expired, or published before it subscribed), changes nothing.

Invariant: once every mirrored attempt has ended or expired, the replicas' ``pending_prefill``,
``unstarted``, ``peer_in_flight`` and the in-flight set hold nothing of any peer. Cost: ``apply``
O(chunks) (the in-flight add/remove), ``expire`` amortised O(1) per attempt.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from router.chunks import Chunks

if TYPE_CHECKING:
    from router.replicas import ReplicaState
    from router.routing import Routed, Router

__all__ = ["KINDS", "Outbox", "PeerEvent", "PeerState"]

KINDS = ("start", "served", "ended", "hello")


class PeerEvent(NamedTuple):
    kind: str  # one of KINDS
    peer: str  # the publishing process (unique per process start)
    rid: int  # the attempt's request, unique within ``peer``
    replica: str = ""
    ts: float = 0.0  # the publisher's wall clock at publication (lag)
    chunks: Chunks | None = None  # start: the request's chunks (``exact`` with precise routing)
    prefill: float = 0.0  # start: predicted prefill tokens on ``replica``
    stream: bool = False  # start: a streamed request (its first byte follows its prefill)
    first: bool = False  # start: a conversation's first turn (the recent-load window)
    status: int = 0  # served: the response status


class Outbox:
    """The publishing half: turns a local request's outcome hooks into `PeerEvent` s for
    ``send`` (the ZMQ publisher, or the simulator's delayed delivery)."""

    def __init__(self, peer: str, send: Callable[[PeerEvent], None],
                 clock: Callable[[], float] = time.time) -> None:
        self.peer = peer
        self.send = send
        self._clock = clock
        self._rids = itertools.count(1)

    def rid(self) -> int:
        return next(self._rids)

    def started(self, routed: Routed, replica: str, prefill: float) -> None:
        self.send(PeerEvent("start", self.peer, routed.peer_rid, replica, self._clock(),
                            routed.chunks, prefill, routed.stream, routed.key.first_turn))

    def served(self, routed: Routed, replica: str, status: int) -> None:
        self.send(PeerEvent("served", self.peer, routed.peer_rid, replica, self._clock(),
                            status=status))

    def ended(self, routed: Routed, replica: str) -> None:
        self.send(PeerEvent("ended", self.peer, routed.peer_rid, replica, self._clock()))

    def hello(self) -> None:
        self.send(PeerEvent("hello", self.peer, 0, ts=self._clock()))


class _Open(NamedTuple):
    routed: Routed
    state: ReplicaState
    expires: float


class PeerState:
    """The peers' in-flight attempts mirrored into one router process's routing state."""

    def __init__(self, router: Router, ttl: float = 30.0, timeout: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, me: str = "") -> None:
        self.router = router
        self.ttl = ttl
        self.timeout = timeout
        self.me = me  # this process's own peer id: its own events are ignored
        self._clock = clock
        self._open: dict[tuple[str, int, str], _Open] = {}
        self._queue: deque[tuple[float, tuple[str, int, str]]] = deque()
        self._seen: dict[str, float] = {}  # peer -> last arrival
        self.applied = 0
        self.ignored = 0  # duplicates, unknown attempts or replicas, own echoes
        self.expired = 0

    def __len__(self) -> int:
        return len(self._open)

    def peers(self) -> dict[str, float]:
        """Peer -> the local clock of its last event."""
        return dict(self._seen)

    def apply(self, e: PeerEvent) -> bool:
        """Apply one event of a peer; False when it changed nothing (module docstring)."""
        now = self._clock()
        if e.peer == self.me:
            self.ignored += 1
            return False
        self._seen[e.peer] = now
        self.expire(now)
        key = (e.peer, e.rid, e.replica)
        if e.kind == "start":
            state = self.router.replicas.get(e.replica)
            if state is None or key in self._open or e.chunks is None:
                self.ignored += 1
                return False
            routed = self.router.mirror(e.replica, e.chunks, e.prefill, e.stream, e.first)
            routed.started(state)
            state.peer_in_flight += 1
            expires = now + self.ttl
            self._open[key] = _Open(routed, state, expires)
            self._queue.append((expires, key))
        elif e.kind == "served":
            got = self._open.get(key)
            if got is None:
                self.ignored += 1
                return False
            got.routed.served(got.state, e.status)
        elif e.kind == "ended":
            if not self._end(key):
                self.ignored += 1
                return False
        elif e.kind != "hello":
            self.ignored += 1
            return False
        self.applied += 1
        return True

    def _end(self, key: tuple[str, int, str]) -> bool:
        got = self._open.pop(key, None)
        if got is None:
            return False
        got.routed.ended(got.state)
        got.state.peer_in_flight = max(0, got.state.peer_in_flight - 1)
        return True

    def expire(self, now: float | None = None) -> int:
        """End the attempts past their TTL and every attempt of a peer silent for ``timeout``;
        returns how many ended."""
        if now is None:
            now = self._clock()
        n = 0
        queue, open_ = self._queue, self._open
        while queue and queue[0][0] <= now:
            expires, key = queue.popleft()
            got = open_.get(key)
            if got is not None and got.expires == expires and self._end(key):
                n += 1
        silent = [p for p, t in self._seen.items() if now - t > self.timeout]
        for peer in silent:
            del self._seen[peer]
            n += self.forget(peer)
        self.expired += n
        return n

    def forget(self, peer: str) -> int:
        """End every attempt of ``peer``; returns how many."""
        keys = [k for k in self._open if k[0] == peer]
        for k in keys:
            self._end(k)
        return len(keys)

    def forget_replica(self, replica: str) -> int:
        """End every mirrored attempt on ``replica`` (it left the membership)."""
        keys = [k for k in self._open if k[2] == replica]
        for k in keys:
            self._end(k)
        return len(keys)
