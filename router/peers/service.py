"""The ZMQ transport of ``routing.peers``: publish this process's attempts, mirror the peers'.

`PeerService(settings, router, metrics)` is what `router.app.RouterApp` builds when
``routing.peers.enabled`` (importing this module needs the ``kv`` extra). It owns:

- the **PUB socket**, bound at ``start`` (`bind_endpoints`: ``routing.peers.bind``, else
  ``tcp://<host>:<port>``; with ``workers`` > 1 the first free port of ``port .. port + workers
  - 1``). A worker given ``siblings`` (the directory the parent of ``serve --workers N`` hands
  out while ``routing.peers`` is off) instead claims the first free slot ``i`` of ``0 ..
  workers - 1`` - an exclusive ``flock`` on ``<siblings>/<i>.lock``, held while the process
  lives, so a worker uvicorn restarts takes the slot of the one that died - binds
  ``ipc://<siblings>/<i>.sock`` and subscribes to the other slots' sockets only
  (`sibling_endpoints`). `Outbox` (installed as ``router.outbox``) hands it every local
  attempt's start / first byte / end as it happens: one encode and one non-blocking send on the event loop - a PUB
  socket never blocks, it drops messages for a subscriber past its high-water mark;
- one **SUB socket** connected to every peer endpoint (`peer_endpoints`: ``endpoints``, the
  sibling workers' ports, and every address of ``dns`` at those ports, re-resolved every
  ``dns_interval`` seconds with the loop's non-blocking resolver; endpoints that disappear are
  disconnected). ZMQ connects and reconnects by itself, so a peer that is not up yet, restarts
  or never exists costs nothing but its reconnect attempts;
- the **receive loop**: each message ``[peer, payload]`` is dropped unread when ``peer`` is this
  process (a DNS name lists this pod too), else decoded (`router.peers.wire`) and applied
  (`router.peers.state.PeerState.apply`). A message that does not decode is counted
  (``prefix_router_peer_decode_errors_total``) and logged (at most once per 10 s) and skipped;
  nothing a peer sends can end the loop. `catch_up`, called by the app just before routing a
  request, applies what the socket already received, so a decision sees every event that arrived
  before it even when the loop was not scheduled since;
- the **heartbeat loop**: every ``heartbeat`` seconds a ``hello``, `PeerState.expire` (a peer
  silent for ``timeout`` loses its mirrored attempts; every attempt ends ``ttl`` after its
  start) and the status gauges.

Start and stop run in the app's lifespan; constructing the service binds and starts nothing.
Replica names must agree between the processes (the same static names or the same discovery):
an event for a replica this process does not know is ignored.

Cost per local attempt: three events of O(chunks) encode each; per peer attempt the same decode
plus `PeerState.apply`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterable

import zmq
import zmq.asyncio

from router.metrics import RouterMetrics
from router.peers.state import Outbox, PeerEvent, PeerState
from router.peers.wire import WireError, decode, encode
from router.routing import Router
from router.settings import PeersSettings, Settings

__all__ = ["PeerService", "bind_endpoints", "peer_endpoints", "sibling_endpoints"]

log = logging.getLogger("prefix_router.peers")

_DRAIN = 512  # messages handled per wake-up before other tasks get the loop
_HWM = 100_000
_LOG_EVERY = 10.0  # seconds between two decode-error log lines
_WILDCARD = ("0.0.0.0", "::", "*", "")


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def bind_endpoints(p: PeersSettings, workers: int) -> list[str]:
    """Where this process may bind its PUB socket, in order of preference."""
    if p.bind is not None:
        return [p.bind]
    return [f"tcp://{_host(p.host)}:{p.port + i}" for i in range(workers)]


def peer_endpoints(p: PeersSettings, workers: int, addresses: Iterable[str] = (),
                   own: str | None = None) -> set[str]:
    """Every endpoint to subscribe to: ``endpoints``, the sibling workers' and each of
    ``addresses`` (``dns`` resolved) at the workers' ports; ``own`` (the bound one) left out."""
    out = set(p.endpoints)
    if workers > 1:
        local = "127.0.0.1" if p.host in _WILDCARD else p.host
        out.update(f"tcp://{_host(local)}:{p.port + i}" for i in range(workers))
    for addr in addresses:
        out.update(f"tcp://{_host(addr)}:{p.port + i}" for i in range(workers))
    if own is not None:
        out.discard(own)
        if own.startswith("tcp://"):  # a wildcard bind is reached at 127.0.0.1 too
            host, _, port = own[6:].rpartition(":")
            if host in _WILDCARD:
                out.discard(f"tcp://127.0.0.1:{port}")
    return out


def sibling_endpoints(siblings: str, workers: int) -> list[str]:
    """The ipc endpoint of each worker slot in the ``siblings`` directory, slot order."""
    return [f"ipc://{os.path.join(siblings, f'{i}.sock')}" for i in range(workers)]


def _claim_slot(siblings: str, workers: int) -> tuple[int, int]:
    """The first slot of ``siblings`` no live process holds: (slot, the locked descriptor)."""
    for i in range(workers):
        fd = os.open(os.path.join(siblings, f"{i}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return i, fd
    raise RuntimeError(f"routing.peers: all {workers} sibling slots in {siblings} are taken")


class PeerService:
    """See the module docstring."""

    def __init__(self, settings: Settings, router: Router, metrics: RouterMetrics, *,
                 siblings: str | None = None) -> None:
        self.settings = settings.routing.peers
        self.workers = settings.workers
        self.siblings = siblings
        self._slot_fd: int | None = None
        self.metrics = metrics
        self.me = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._me = self.me.encode()
        p = self.settings
        self.state = PeerState(router, p.ttl, p.timeout, me=self.me)
        self.outbox = Outbox(self.me, self._send)
        router.outbox = self.outbox
        self.bound: str | None = None  # the endpoint the PUB socket is bound to
        self.connected: set[str] = set()  # endpoints the SUB socket is connected to
        self.decode_errors = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket[bytes] | None = None  # a shadow of ``_pub_owner``, for sends
        self._pub_owner: zmq.asyncio.Socket | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._sync: zmq.Socket[bytes] | None = None  # the SUB socket, for `catch_up`
        self._tasks: list[asyncio.Task[None]] = []
        self._addresses: set[str] = set()
        self._logged = 0.0

    # -- publishing (the hot path) -------------------------------------------------------------

    def _send(self, e: PeerEvent) -> None:
        pub = self._pub
        if pub is None:
            return
        try:
            payload = encode(e)
        except WireError as exc:  # never fail the request that published it
            log.warning("peers: cannot encode %s: %s", e.kind, exc)
            return
        try:
            pub.send_multipart((self._me, payload), zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # PUB drops at its HWM; only a closing socket raises
            log.debug("peers: send failed: %s", exc)
            return
        self.metrics.peer_event_sent(e.kind)

    # -- lifespan ------------------------------------------------------------------------------

    async def start(self) -> None:
        candidates = bind_endpoints(self.settings, self.workers)
        wanted: set[str] = set()
        if self.siblings is not None:  # before any socket: a failed claim leaves nothing open
            slot, self._slot_fd = _claim_slot(self.siblings, self.workers)
            ends = sibling_endpoints(self.siblings, self.workers)
            candidates, wanted = [ends[slot]], set(ends) - {ends[slot]}
        ctx = self._ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, _HWM)
        errors = []
        for endpoint in candidates:
            try:
                pub.bind(endpoint)
            except zmq.ZMQError as exc:
                errors.append(f"{endpoint}: {exc}")
                continue
            self.bound = endpoint
            break
        if self.bound is None:
            pub.close(0)
            ctx.destroy(0)
            self._ctx = None
            self._release_slot()
            raise RuntimeError("routing.peers: cannot bind the peer socket (" +
                               "; ".join(errors) + ")")
        self._pub = zmq.Socket.shadow(pub.underlying)
        self._pub_owner = pub
        sub = self._sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, _HWM)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sync = zmq.Socket.shadow(sub.underlying)
        self._connect(wanted if self.siblings is not None
                      else peer_endpoints(self.settings, self.workers, (), self.bound))
        log.info("peers: %s publishing on %s, subscribed to %d endpoint(s)%s", self.me,
                 self.bound, len(self.connected),
                 f" and the addresses of {self.settings.dns}"
                 if self.settings.dns and self.siblings is None else "")
        self._tasks = [asyncio.create_task(self._receive(), name="peers-receive"),
                       asyncio.create_task(self._heartbeat(), name="peers-heartbeat")]
        if self.settings.dns and self.siblings is None:
            self._tasks.append(asyncio.create_task(self._resolve(), name="peers-dns"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        self._pub = self._sync = None
        self._pub_owner = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None
        self._sub = None
        self.connected = set()
        self._release_slot()

    def _release_slot(self) -> None:
        if self._slot_fd is not None:
            os.close(self._slot_fd)  # drops the flock: a later worker may take the slot
            self._slot_fd = None

    # -- subscriptions -------------------------------------------------------------------------

    def _connect(self, wanted: set[str]) -> None:
        sub = self._sub
        if sub is None:
            return
        for endpoint in sorted(self.connected - wanted):
            with contextlib.suppress(zmq.ZMQError):
                sub.disconnect(endpoint)
            self.connected.discard(endpoint)
        for endpoint in sorted(wanted - self.connected):
            try:
                sub.connect(endpoint)
            except zmq.ZMQError as exc:  # e.g. an address ZMQ cannot parse: skip it
                log.warning("peers: cannot connect to %s: %s", endpoint, exc)
                continue
            self.connected.add(endpoint)

    async def _resolve(self) -> None:
        name = self.settings.dns
        assert name is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                infos = await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
                addresses = {str(info[4][0]) for info in infos}
            except (OSError, UnicodeError) as exc:
                log.warning("peers: cannot resolve %s: %s; keeping %d address(es)", name, exc,
                            len(self._addresses))
            else:
                if addresses != self._addresses:
                    self._addresses = addresses
                    self._connect(peer_endpoints(self.settings, self.workers, addresses,
                                                 self.bound))
            await asyncio.sleep(self.settings.dns_interval)

    # -- receiving -----------------------------------------------------------------------------

    async def _receive(self) -> None:
        sub = self._sub
        assert sub is not None
        while True:
            if await sub.poll(1000) == 0:
                continue
            for _ in range(_DRAIN):
                try:
                    frames = await sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._message(frames)
            await asyncio.sleep(0)

    def catch_up(self) -> None:
        """Apply, now, every message the SUB socket has already received (non-blocking)."""
        sync = self._sync
        if sync is None:
            return
        for _ in range(_DRAIN):
            try:
                frames = sync.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._message(frames)

    def _message(self, frames: list[bytes]) -> None:
        if len(frames) == 2 and frames[0] == self._me:
            return
        try:
            if len(frames) != 2:
                raise WireError(f"expected 2 frames [peer, payload], got {len(frames)}")
            event = decode(frames[0], frames[1])
        except WireError as exc:
            self.decode_errors += 1
            self.metrics.peer_decode_errors.inc()
            now = time.monotonic()
            if now - self._logged >= _LOG_EVERY:
                self._logged = now
                log.warning("peers: dropped a malformed message (%s); %d so far", exc,
                            self.decode_errors)
            return
        try:
            applied = self.state.apply(event)
        except Exception:  # a bug must not end the mirroring: log it, drop the event
            log.exception("peers: applying %s of %s failed", event.kind, event.peer)
            return
        self.metrics.peer_event_received(event.kind, applied, time.time() - event.ts)

    # -- heartbeat -----------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        expired = 0
        while True:
            try:
                self.outbox.hello()
                self.state.expire()
                n = self.state.expired - expired
                expired = self.state.expired
                self.metrics.peer_status(len(self.state.peers()), len(self.state), n)
            except Exception:  # never end the heartbeat: the peers would forget this process
                log.exception("peers: heartbeat failed")
            await asyncio.sleep(self.settings.heartbeat)

    # -- membership ----------------------------------------------------------------------------

    def forget(self, replicas: Iterable[str]) -> None:
        """Replicas that left the membership: end every mirrored attempt on them."""
        for name in replicas:
            self.state.forget_replica(name)
