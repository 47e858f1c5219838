"""One ZMQ SUB loop per replica, feeding the precise index; resync by replay, or drop.

`KvSubscribers` follows the membership (``update``, called by the app whenever discovery or
health changes it): a `Feed` task per replica, started and stopped in the app's lifespan,
restarted when the replica's endpoint changes, cancelled - and its entries forgotten - when it
leaves. The endpoint is ``tcp://<replica URL host>:<routing.kv_events.port>`` (a Kubernetes pod
IP works as-is) unless the replica's static entry names ``kv_events_endpoint``; the replay
endpoint likewise with ``replay_port`` / ``kv_replay_endpoint``.

A feed's state machine (the index answers for the replica only while it is *live*):

- The SUB socket connects (ZMQ reconnects by itself). When a connection's handshake succeeds
  (the first one and every reconnect) the feed **resyncs**, live only once that succeeded.
- Resync: with a replay endpoint, ask for the batches from the last applied sequence number
  ``L`` (`router.kv_events.replay`); the first one must be ``L`` with the payload digest the
  feed applied, which proves the same publisher is still on the other end - then the rest is
  applied. Otherwise (the replica restarted, or its buffer rolled past ``L``), or when nothing
  was applied yet, the replica's entries are dropped and everything it buffers is replayed from
  0 (a replica that ran longer than its buffer yields a partial index: it under-predicts, never
  over-predicts). If the replay fails (no answer within ``replay_timeout``, malformed frames or
  payloads) the entries are **dropped**, not kept stale, the replica stays off precise routing
  and the resync is retried with exponential backoff (1 s .. ``retry_max``). Without a replay
  endpoint a resync drops the entries and goes live with what arrives from then on.
- A message: ``seq == L + 1`` is decoded and applied; ``seq <= L`` is a duplicate (a replay
  overlapping the stream) and skipped; ``seq > L + 1`` is a **gap**, and a payload that does
  not decode is **malformed**: both take the replica off and resync.
- A disconnect takes the replica off (its entries wait for the reconnect's verification); an
  ejection by the health checks drops its entries (``reset``) and resyncs.

Every resync is logged and counted (``prefix_router_kv_resyncs_total{replica,reason,outcome}``),
every drop too (``prefix_router_kv_dropped_replicas_total{replica,reason}``); applied events by
type, the lag from a batch's timestamp to its application, and the index's blocks per replica
are metrics as well.

Cost: per batch, one decode plus `PreciseIndex.apply` per event; all on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

import xxhash
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from router.kv_events.index import PreciseIndex
from router.kv_events.replay import ReplayError, fetch
from router.kv_events.wire import EventBatch, WireError, decode_batch, decode_seq
from router.metrics import RouterMetrics
from router.replicas import ReplicaState
from router.settings import KvEventsSettings, ReplicaSpec

__all__ = ["Feed", "KvSubscribers", "endpoints_for"]

log = logging.getLogger("prefix_router.kv_events")

_DRAIN = 512  # messages handled per wake-up before other tasks get the loop
_IDLE_POLL = 0.5  # seconds between checks for a pending resync (an ejection sets one)
_MONITOR = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


def endpoints_for(url: str, settings: KvEventsSettings,
                  spec: ReplicaSpec | None = None) -> tuple[str, str | None]:
    """(events endpoint, replay endpoint or None) of the replica at ``url``."""
    host = urlsplit(url).hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    events = f"tcp://{host}:{settings.port}"
    replay = None if settings.replay_port is None else f"tcp://{host}:{settings.replay_port}"
    if spec is not None:
        events = spec.kv_events_endpoint or events
        replay = spec.kv_replay_endpoint or replay
    return events, replay


class Feed:
    """The SUB loop of one replica (see the module docstring)."""

    def __init__(self, name: str, endpoint: str, replay: str | None, settings: KvEventsSettings,
                 index: PreciseIndex, metrics: RouterMetrics, ctx: zmq.asyncio.Context) -> None:
        self.name = name
        self.endpoint = endpoint
        self.replay = replay
        self.settings = settings
        self.index = index
        self.metrics = metrics
        self.ctx = ctx
        self.last: int | None = None  # sequence number of the last applied batch
        self._digest = 0  # of the last applied payload
        self._pending: str | None = None  # the reason of a resync still to do
        self._retry_at = 0.0
        self._backoff = 1.0
        self._connected = 0  # successful handshakes so far
        self._sync: zmq.Socket[bytes] | None = None  # the SUB socket, for `catch_up`
        self._resyncing = False
        self.applied = 0  # batches applied (for tests and logs)

    # -- control from the app ------------------------------------------------------------------

    def reset(self, reason: str) -> None:
        """Drop the replica's entries and resync as soon as possible (an ejection)."""
        self._drop(reason)
        self._want(reason, now=True)

    def _want(self, reason: str, now: bool = False) -> None:
        self.index.set_live(self.name, False)
        self.metrics.kv_precise(self.name, False)
        if self._pending is None or now:
            self._pending = reason
        if now:
            self._retry_at = 0.0

    def _drop(self, reason: str) -> None:
        n = self.index.drop(self.name)
        self.last = None
        self.metrics.kv_dropped(self.name, reason, n)
        self.metrics.kv_blocks(self.name, 0)

    # -- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, self.settings.topic.encode())
        monitor = sub.get_monitor_socket(_MONITOR)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        self.index.set_live(self.name, False)
        self.metrics.kv_precise(self.name, False)
        self._sync = zmq.Socket.shadow(sub.underlying)
        try:
            sub.connect(self.endpoint)
            while True:
                if self._pending is not None and time.monotonic() >= self._retry_at:
                    await self._resync(self._pending)
                ready = dict(await poller.poll(int(_IDLE_POLL * 1000)))
                if monitor in ready:
                    await self._on_monitor(monitor)
                if sub in ready:
                    await self._drain(sub)
        finally:
            self._sync = None
            self.index.set_live(self.name, False)
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            monitor.close(0)
            sub.close(0)

    async def _on_monitor(self, monitor: zmq.asyncio.Socket) -> None:
        while True:
            try:
                frames = await monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._connected += 1
                self._want("connect" if self._connected == 1 else "reconnect", now=True)
            elif event == zmq.EVENT_DISCONNECTED:
                log.warning("kv events: %s disconnected (%s); off precise routing until it "
                            "reconnects", self.name, self.endpoint)
                self.index.set_live(self.name, False)
                self.metrics.kv_precise(self.name, False)

    async def _drain(self, sub: zmq.asyncio.Socket) -> None:
        for _ in range(_DRAIN):
            try:
                frames = await sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._message(frames)
        await asyncio.sleep(0)

    def catch_up(self) -> None:
        """Apply, now, every message the socket has already received (called before routing a
        request, so that events that arrived with or before the replica's last response count,
        even when this loop has not been scheduled since)."""
        sync = self._sync
        if sync is None or self._resyncing:
            return
        for _ in range(_DRAIN):
            try:
                frames = sync.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._message(frames)

    def _message(self, frames: list[bytes]) -> None:
        if self._pending is not None:
            return  # the resync's replay covers it
        try:
            if len(frames) != 3:
                raise WireError(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
            seq = decode_seq(frames[1])
        except WireError as exc:
            self._malformed(exc)
            return
        last = self.last
        if last is not None:
            if seq <= last:
                return
            if seq != last + 1:
                log.warning("kv events: %s sequence gap (batch %d after %d); resyncing",
                            self.name, seq, last)
                self._want("gap", now=True)
                return
        try:
            batch = decode_batch(frames[2])
        except WireError as exc:
            self._malformed(exc)
            return
        self._apply(seq, frames[2], batch)

    def _malformed(self, exc: Exception) -> None:
        log.warning("kv events: %s sent a malformed message (%s); resyncing", self.name, exc)
        self._want("malformed", now=True)

    def _apply(self, seq: int, payload: bytes, batch: EventBatch) -> None:
        index, name, metrics = self.index, self.name, self.metrics
        for event in batch.events:
            index.apply(name, event)
        metrics.kv_batch(name, batch, time.time() - batch.ts, index.blocks(name))
        self.last = seq
        self._digest = xxhash.xxh3_64_intdigest(payload)
        self.applied += 1

    # -- resync --------------------------------------------------------------------------------

    async def _resync(self, reason: str) -> None:
        self._pending = None
        self._resyncing = True
        try:
            await self._resync_now(reason)
        finally:
            self._resyncing = False

    async def _resync_now(self, reason: str) -> None:
        if self.replay is None:
            self._drop(reason)
            self._live(reason, "no_replay")
            return
        try:
            outcome = await self._replay()
        except ReplayError as exc:
            self._drop(reason)
            delay = self._backoff
            self._backoff = min(self._backoff * 2, self.settings.retry_max)
            self._pending = reason
            self._retry_at = time.monotonic() + delay
            self.metrics.kv_resync(self.name, reason, "failed")
            log.warning("kv events: %s resync (%s) failed: %s; its entries are dropped, routing "
                        "uses the approximate index for it; retry in %.0f s",
                        self.name, reason, exc, delay)
            return
        self._backoff = 1.0
        self._live(reason, outcome)

    def _live(self, reason: str, outcome: str) -> None:
        self.index.set_live(self.name, True)
        self.metrics.kv_precise(self.name, True)
        self.metrics.kv_resync(self.name, reason, outcome)
        self.metrics.kv_blocks(self.name, self.index.blocks(self.name))
        log.info("kv events: %s resynced (%s: %s), %d blocks, at batch %s", self.name, reason,
                 outcome, self.index.blocks(self.name), self.last)

    async def _replay(self) -> str:
        """Bring the index up to the replica's latest batch; the outcome label."""
        assert self.replay is not None
        timeout = self.settings.replay_timeout
        if self.last is not None:
            got = await fetch(self.ctx, self.replay, self.last, timeout)
            if got and got[0][0] == self.last and \
                    xxhash.xxh3_64_intdigest(got[0][1]) == self._digest:
                self._apply_all(got[1:])
                return "continued"
            self._drop("restarted")
        got = await fetch(self.ctx, self.replay, 0, timeout)
        self.index.drop(self.name)
        self._apply_all(got)
        return "replayed" if not got or got[0][0] == 0 else "partial"

    def _apply_all(self, got: list[tuple[int, bytes]]) -> None:
        decoded = []
        for seq, payload in got:
            try:
                decoded.append((seq, payload, decode_batch(payload)))
            except WireError as exc:
                raise ReplayError(f"batch {seq}: {exc}") from exc
        for seq, payload, batch in decoded:
            self._apply(seq, payload, batch)


class KvSubscribers:
    """A `Feed` per replica of the membership (see the module docstring)."""

    def __init__(self, settings: KvEventsSettings, specs: Iterable[ReplicaSpec],
                 index: PreciseIndex, metrics: RouterMetrics) -> None:
        self.settings = settings
        self.specs: Mapping[str, ReplicaSpec] = {s.name: s for s in specs}
        self.index = index
        self.metrics = metrics
        self.feeds: dict[str, Feed] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._healthy: dict[str, bool] = {}
        self._ctx: zmq.asyncio.Context | None = None
        self._states: tuple[ReplicaState, ...] = ()
        self._stopping: set[asyncio.Task[None]] = set()  # cancelled, not finished yet

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self.update(self._states)

    def update(self, states: Iterable[ReplicaState]) -> None:
        """The membership or a replica's health changed."""
        self._states = tuple(states)
        if self._ctx is None:
            return
        wanted = {}
        for s in self._states:
            wanted[s.name] = endpoints_for(s.url, self.settings, self.specs.get(s.name))
        for name in [n for n in self.feeds if n not in wanted or
                     (self.feeds[n].endpoint, self.feeds[n].replay) != wanted[n]]:
            self._stop(name)
        for s in self._states:
            if s.name not in self.feeds:
                events, replay = wanted[s.name]
                feed = Feed(s.name, events, replay, self.settings, self.index, self.metrics,
                            self._ctx)
                self.feeds[s.name] = feed
                self._tasks[s.name] = asyncio.create_task(self._run(feed),
                                                          name=f"kv-events-{s.name}")
            was = self._healthy.get(s.name, True)
            if was and not s.healthy:
                log.warning("kv events: %s ejected; its entries are dropped", s.name)
                self.feeds[s.name].reset("ejected")
            self._healthy[s.name] = s.healthy

    def catch_up(self) -> None:
        """`Feed.catch_up` for every replica: O(replicas) non-blocking receives when idle."""
        for feed in self.feeds.values():
            feed.catch_up()

    async def _run(self, feed: Feed) -> None:
        backoff = 1.0
        while True:  # a bug in one feed must not end precise routing for good
            try:
                await feed.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("kv events: %s subscriber failed; restarting", feed.name)
                feed.reset("error")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.retry_max)

    def _stop(self, name: str) -> None:
        self.feeds.pop(name)
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        self._healthy.pop(name, None)
        self.index.forget(name)
        self.metrics.kv_forget(name)

    async def stop(self) -> None:
        tasks = [*self._tasks.values(), *self._stopping]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self.feeds.clear()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)  # every socket is closed by now; closes any left
            self._ctx = None
