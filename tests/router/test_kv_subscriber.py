"""The KV-event subscriber over real ZMQ: replay at connect, gaps, malformed payloads, a replay
endpoint that never answers, a replica killed and restarted, ejection and departure."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import zmq.asyncio

from router.chunks import Chunks
from router.kv_events.index import PreciseIndex
from router.kv_events.subscriber import KvSubscribers, endpoints_for
from router.kv_events.wire import BlockRemoved, BlockStored
from router.metrics import RouterMetrics
from router.replicas import ReplicaState
from router.settings import KvEventsSettings, ReplicaSpec
from templates_audit.blocks import block_hashes
from tests.router.kv_publisher import Publisher

BS = 4
PROMPT = list(range(1, 18))
KEYS = block_hashes(PROMPT, BS)
EXACT = Chunks(tuple(KEYS), tuple(BS * (i + 1) for i in range(len(KEYS))), len(PROMPT))
SETTINGS = KvEventsSettings(enabled=True, topic="kv", replay_timeout=0.3, retry_max=0.5)


def stored(engine: list[int], parent: int | None, lo: int, hi: int) -> BlockStored:
    return BlockStored(block_hashes=engine, parent_block_hash=parent,
                       token_ids=PROMPT[lo:hi], block_size=BS)


async def until(check: Callable[[], bool], what: str, tries: int = 500) -> None:
    for _ in range(tries):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Harness:
    def __init__(self, pub: Publisher, settings: KvEventsSettings = SETTINGS) -> None:
        self.pub = pub
        self.index = PreciseIndex(0)
        self.metrics = RouterMetrics()
        self.spec = ReplicaSpec("r0", "http://127.0.0.1:1",
                                kv_events_endpoint=f"tcp://127.0.0.1:{pub.port}",
                                kv_replay_endpoint=f"tcp://127.0.0.1:{pub.replay_port}")
        self.state = ReplicaState("r0", self.spec.url)
        self.subs = KvSubscribers(settings, [self.spec], self.index, self.metrics)

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, {"replica": "r0", **labels}) or 0.0

    def resyncs(self, reason: str, outcome: str) -> float:
        return self.sample("prefix_router_kv_resyncs_total", reason=reason, outcome=outcome)

    def matched(self) -> int:
        return self.index.match(EXACT).get("r0", 0)

    @property
    def feed(self) -> Any:
        return self.subs.feeds["r0"]


def run(body: Callable[[Harness], Awaitable[None]], **pub_kw: Any) -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        pub = Publisher(ctx, **pub_kw)
        h = Harness(pub)
        await h.subs.start()
        try:
            await body(h)
        finally:
            await h.subs.stop()
            await pub.close()
            ctx.term()

    asyncio.run(main())


def test_endpoints_come_from_the_replica_host_unless_configured() -> None:
    s = KvEventsSettings(port=5557, replay_port=5558)
    assert endpoints_for("http://10.0.0.7:8000", s) == ("tcp://10.0.0.7:5557",
                                                        "tcp://10.0.0.7:5558")
    assert endpoints_for("http://[fd00::1]:8000", KvEventsSettings(replay_port=None)) == (
        "tcp://[fd00::1]:5557", None)
    spec = ReplicaSpec("a", "http://h:1", kv_events_endpoint="tcp://other:9")
    assert endpoints_for("http://h:1", s, spec) == ("tcp://other:9", "tcp://h:5558")


def test_history_is_replayed_at_connect_then_the_stream_applies() -> None:
    async def body(h: Harness) -> None:
        await h.pub.publish(stored([1, 2], None, 0, 8))  # before the router subscribed
        h.subs.update([h.state])
        await until(lambda: h.index.live("r0"), "live")
        assert h.matched() == 8 and h.resyncs("connect", "replayed") == 1
        for _ in range(50):  # the SUB's subscription reaches the PUB some time after connect
            await h.pub.publish(stored([3], 2, 8, 12))
            await h.pub.publish(BlockRemoved(block_hashes=[3]))
            if h.feed.applied > 3:
                break
            await asyncio.sleep(0.02)
        await h.pub.publish(stored([3, 4], 2, 8, 16))
        await until(lambda: h.matched() == 16, "the stream applied")
        assert h.sample("prefix_router_kv_events_total", type="BlockStored") >= 2
        assert h.sample("prefix_router_kv_index_blocks") == 4
        assert h.sample("prefix_router_kv_replica_precise") == 1

    run(body, topic="kv")


async def _live_and_streaming(h: Harness) -> None:
    h.subs.update([h.state])
    await until(lambda: h.index.live("r0"), "live")
    for _ in range(100):  # until a streamed batch (not only the replay) was applied
        await h.pub.publish()
        if h.feed.last is not None and h.feed.last >= 1 and h.feed.applied >= 1:
            await until(lambda: h.feed.last == h.pub.seq - 1, "caught up")
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the stream never arrived")


def test_a_sequence_gap_is_resynced_from_the_replay_buffer() -> None:
    async def body(h: Harness) -> None:
        await _live_and_streaming(h)
        await h.pub.publish(stored([1, 2, 3], None, 0, 12), skip=2)
        await until(lambda: h.resyncs("gap", "continued") == 1, "the gap's resync")
        await until(lambda: h.matched() == 12, "the batch after the gap")
        assert h.index.live("r0")

    run(body)


def test_a_malformed_payload_drops_the_entries_and_falls_back() -> None:
    async def body(h: Harness) -> None:
        await _live_and_streaming(h)
        await h.pub.publish(stored([1, 2], None, 0, 8))
        await until(lambda: h.matched() == 8, "stored")
        await h.pub.publish(payload=b"\xc1 not msgpack")
        # the replay carries the same bad batch: the resync fails, the entries go
        await until(lambda: h.resyncs("malformed", "failed") >= 1, "the failed resync")
        assert not h.index.live("r0") and h.index.blocks("r0") == 0
        assert h.sample("prefix_router_kv_dropped_replicas_total", reason="malformed") == 1
        assert h.sample("prefix_router_kv_replica_precise") == 0

    run(body)


def test_a_replay_endpoint_that_never_answers_leaves_the_replica_approximate() -> None:
    async def body(h: Harness) -> None:
        h.pub.silent = True
        await h.pub.publish(stored([1, 2], None, 0, 8))
        h.subs.update([h.state])
        await until(lambda: h.resyncs("connect", "failed") >= 2, "two failed attempts")
        assert not h.index.live("r0") and h.index.blocks("r0") == 0
        h.pub.silent = False  # the endpoint comes back: the next retry succeeds
        await until(lambda: h.index.live("r0"), "live after the retry")
        assert h.matched() == 8

    run(body)


def test_a_replica_killed_and_restarted_loses_its_old_entries() -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        pub = Publisher(ctx)
        h = Harness(pub)
        await h.subs.start()
        try:
            await _live_and_streaming(h)
            await pub.publish(stored([1, 2, 3, 4], None, 0, 16))
            await until(lambda: h.matched() == 16, "stored")
            await pub.close()  # killed mid-stream
            await until(lambda: not h.index.live("r0"), "off precise routing")
            # restarted on the same ports, with an empty cache and sequence numbers from 0
            again = Publisher.__new__(Publisher)
            again.ctx, again.topic = ctx, pub.topic
            again.port, again.replay_port = pub.port, pub.replay_port
            again.pub = ctx.socket(zmq.PUB)
            again.pub.bind(f"tcp://127.0.0.1:{pub.port}")
            again.router = ctx.socket(zmq.ROUTER)
            again.router.bind(f"tcp://127.0.0.1:{pub.replay_port}")
            again.seq, again.buffer, again.silent, again.replays = 0, [], False, 0
            again._task = asyncio.create_task(again._serve())
            await again.publish(stored([9], None, 0, 4))
            await until(lambda: h.index.live("r0") and h.matched() == 4, "the new process")
            assert h.index.engine_hashes("r0") == {9}
            assert h.resyncs("reconnect", "replayed") == 1
            assert h.sample("prefix_router_kv_dropped_replicas_total", reason="restarted") == 1
            await again.close()
        finally:
            await h.subs.stop()
            ctx.term()

    asyncio.run(main())


def test_ejection_drops_entries_and_departure_forgets_the_replica() -> None:
    async def body(h: Harness) -> None:
        await _live_and_streaming(h)
        await h.pub.publish(stored([1, 2], None, 0, 8))
        await until(lambda: h.matched() == 8, "stored")
        h.state.healthy = False
        h.subs.update([h.state])
        assert h.index.blocks("r0") == 0 and not h.index.live("r0")
        assert h.sample("prefix_router_kv_dropped_replicas_total", reason="ejected") == 1
        # readmitted: the resync replays the buffer again
        h.state.healthy = True
        h.subs.update([h.state])
        await until(lambda: h.index.live("r0") and h.matched() == 8, "replayed after ejection")
        h.subs.update([])
        assert "r0" not in h.subs.feeds and h.index.blocks("r0") == 0

    run(body)
