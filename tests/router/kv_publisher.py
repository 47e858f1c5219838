"""A scriptable vLLM KV-event publisher for subscriber tests: real ZMQ PUB + ROUTER replay.

It speaks vLLM's protocol (`router.kv_events.wire`) and can misbehave on demand: skip sequence
numbers, send a payload that is not msgpack, or keep a replay request unanswered. Runs on the
caller's event loop (zmq.asyncio).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import zmq
import zmq.asyncio

from loadtest._net import quiet_port
from router.kv_events.wire import REPLAY_END, EventBatch, decode_seq, encode_batch, encode_seq


class Publisher:
    def __init__(self, ctx: zmq.asyncio.Context, topic: str = "kv") -> None:
        self.ctx = ctx
        self.topic = topic.encode()
        self.port = quiet_port()
        self.replay_port = quiet_port()
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self.silent = False  # never answer replay requests
        self.replays = 0
        self._task = asyncio.create_task(self._serve())

    async def publish(self, *events: object, skip: int = 0, payload: bytes | None = None) -> int:
        """Publish one batch (or the raw ``payload``); ``skip`` sequence numbers first. The
        skipped batches are buffered for replay (the subscriber missed them, the replica did
        not)."""
        for _ in range(skip):
            self.buffer.append((self.seq, encode_batch(EventBatch(time.time(), []))))
            self.seq += 1
        data = payload if payload is not None else encode_batch(
            EventBatch(time.time(), list(events)))  # type: ignore[arg-type]
        seq = self.seq
        self.buffer.append((seq, data))
        self.seq += 1
        await self.pub.send_multipart([self.topic, encode_seq(seq), data])
        return seq

    async def _serve(self) -> None:
        while True:
            frames = await self.router.recv_multipart()
            self.replays += 1
            if self.silent:
                continue
            client, start = frames[0], decode_seq(frames[2])
            for seq, data in self.buffer:
                if seq >= start:
                    await self.router.send_multipart([client, b"", self.topic, encode_seq(seq),
                                                      data])
            await self.router.send_multipart([client, b"", b"", encode_seq(REPLAY_END), b""])

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.pub.close(0)
        self.router.close(0)
