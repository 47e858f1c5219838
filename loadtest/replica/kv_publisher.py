"""vLLM's ZMQ KV-event publisher, for the simulated replica: PUB stream plus a replay ROUTER.

What goes out is what vLLM 0.32.0's ``ZmqEventPublisher`` sends (docs/kv-events.md):

- PUB at ``endpoint``: every batch as ``[topic, seq, payload]``; ``seq`` counts from 0, 8 bytes
  big-endian; ``payload`` is `router.kv_events.wire.encode_batch` of the batch.
- ROUTER at ``replay_endpoint`` (optional): a request ``[client_id, b"", start_seq]`` (a DEALER
  sends ``[b"", start_seq]``) is answered with every buffered batch whose seq >= start_seq as
  ``[client_id, b"", topic, seq, payload]``, then ``[client_id, b"", b"", -1, b""]``. The buffer
  holds the last ``buffer_steps`` batches. Requests of another shape are logged and ignored.

Threads: ``publish`` (the engine's event loop) only puts the batch in a bounded queue, never
blocks: when ``max_queue_size`` batches wait it drops the new one and counts it in ``dropped``
(vLLM 0.32.0's ``publish`` blocks the engine on a full queue instead). One daemon thread owns both
sockets: it answers replay requests between batches, encodes, sends and buffers. PUB itself drops
for a subscriber that is ``hwm`` messages behind (ZMQ's rule). The ROUTER's send high-water mark
is raised to hold a whole replay of the buffer (vLLM keeps ZMQ's default 1,000, which truncates a
longer replay silently).

Invariants: sequence numbers are consecutive in publish order, never reused by this process; a
replay answers in seq order and always ends with the marker. Cost per batch: one msgpack encode
plus one multipart send, in the publisher thread.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections import deque
from typing import Any

import zmq

from router.kv_events.wire import REPLAY_END, EventBatch, encode_batch, encode_seq

from .kv_config import KvEventsConfig, is_bind_endpoint

__all__ = ["ZmqPublisher"]

log = logging.getLogger("loadtest.replica.kv_events")

_POLL_SECONDS = 0.02   # how long the thread waits for a batch before it looks at replay again
_CLOSE_SECONDS = 1.0


class ZmqPublisher:
    """Binds (or connects) its sockets at construction; `close()` stops the thread."""

    def __init__(self, config: KvEventsConfig) -> None:
        self.config = config
        self._topic = config.topic.encode("utf-8")
        self._queue: queue.Queue[EventBatch | None] = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._seq = itertools.count()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[Any] | None = None
        self.published = 0   # batches sent on the PUB socket
        self.dropped = 0     # batches refused by a full queue
        self.replays = 0     # replay requests answered
        self.errors = 0      # batches that failed to encode or send
        self._accepted = 0   # batches ``publish`` queued (the thread finishes each: sent or error)
        try:
            self._pub.set_hwm(config.hwm)
            if is_bind_endpoint(config.endpoint):
                self._pub.bind(config.endpoint)
            else:
                self._pub.connect(config.endpoint)
            self.endpoint = self._last_endpoint(self._pub, config.endpoint)
            self.replay_endpoint: str | None = None
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.SNDHWM, max(1000, 2 * config.buffer_steps + 2))
                self._replay.bind(config.replay_endpoint)
                self.replay_endpoint = self._last_endpoint(self._replay, config.replay_endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise OSError(f"KV events: cannot open {config.endpoint}"
                          f"{' / ' + config.replay_endpoint if config.replay_endpoint else ''}: "
                          f"{exc}") from exc
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()

    @staticmethod
    def _last_endpoint(sock: zmq.Socket[Any], asked: str) -> str:
        """The endpoint actually bound (``tcp://0.0.0.0:41234`` for ``tcp://*:0``)."""
        got = sock.getsockopt(zmq.LAST_ENDPOINT)
        text = got.decode() if isinstance(got, bytes) else str(got)
        return text or asked

    # -- the engine side ---------------------------------------------------------------------
    def publish(self, batch: EventBatch) -> bool:
        """Queue ``batch`` for the publisher thread; False (and counted) when the queue is full."""
        if not self._running:
            return False
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.dropped += 1
            return False
        self._accepted += 1
        return True

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    @property
    def unsent(self) -> int:
        """Batches accepted by ``publish`` and not yet sent (or failed): the queued ones plus the
        one the thread may hold between taking it off the queue and sending it. 0 together with
        a subscriber at ``last_seq`` means that subscriber has every batch published so far."""
        return self._accepted - self.published - self.errors

    @property
    def last_seq(self) -> int | None:
        """The seq of the latest batch sent (None before the first)."""
        return self._buffer[-1][0] if self._buffer else None

    def stats(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint,
                "topic": self.config.topic, "published": self.published, "dropped": self.dropped,
                "queued": self.queued, "unsent": self.unsent, "replays": self.replays, "errors": self.errors,
                "last_seq": self.last_seq, "buffered": len(self._buffer)}

    # -- the publisher thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            if self._replay is not None:
                self._serve_replays()
            try:
                batch = self._queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if not self._running:
                    break
                continue
            if batch is None:
                break
            try:
                seq = next(self._seq)
                payload = encode_batch(batch)
                self._pub.send_multipart((self._topic, encode_seq(seq), payload), copy=False)
                self._buffer.append((seq, payload))
                self.published += 1
            except Exception:  # one bad batch must not end the stream
                self.errors += 1
                log.exception("KV events: publishing a batch failed")

    def _serve_replays(self) -> None:
        assert self._replay is not None
        while self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3:
                log.warning("KV events: ignoring a replay request of %d frames", len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")   # as vLLM reads it (unsigned)
            for seq, payload in list(self._buffer):
                if seq >= first:
                    self._replay.send_multipart(
                        (client, b"", self._topic, encode_seq(seq), payload))
            self._replay.send_multipart((client, b"", b"", encode_seq(REPLAY_END), b""))
            self.replays += 1

    # -- shutdown ----------------------------------------------------------------------------
    def close(self) -> None:
        """Send what is queued (up to a second), stop the thread, close the sockets."""
        if not self._running:
            return
        self._running = False
        try:
            self._queue.put(None, timeout=_CLOSE_SECONDS)
        except queue.Full:
            pass
        self._thread.join(timeout=_CLOSE_SECONDS + 1)
        if self._thread.is_alive():
            log.warning("KV events: the publisher thread did not stop; %d batches unsent",
                        self.queued)
            return   # the thread still owns the sockets; the daemon dies with the process
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
