"""The simulated replica publishes vLLM's KV cache events from its real block pool.

Engine-level tests replay the journal's events onto a set after every batch and compare it with
the pool's cached hashes (timed engine with preemption, instant path, LoRA, aborts, resets). The
loopback tests subscribe with a real ZMQ SUB socket to a replica served on 127.0.0.1, decode with
the codec the router uses, and ask the real replay ROUTER for what a gap missed.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from loadtest._net import quiet_port  # noqa: E402
from loadtest.replica import Replica, ReplicaConfig  # noqa: E402
from loadtest.replica.engine import Engine, EngineLimits, EngineRequest  # noqa: E402
from loadtest.replica.kv_config import (  # noqa: E402
    KvEventsConfig,
    parse_kv_events_config,
    with_port,
)
from loadtest.replica.kv_events import MASK64, EventJournal, lora_ids  # noqa: E402
from loadtest.replica.kv_publisher import ZmqPublisher  # noqa: E402
from loadtest.replica.timing import TimingModel  # noqa: E402
from router.kv_events.wire import (  # noqa: E402
    REPLAY_END,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_batch,
    decode_seq,
    encode_seq,
)
from templates_audit.blocks import block_hashes  # noqa: E402

HTTP = httpx.Client(timeout=30)


def _signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def apply(state: set[int], batch: EventBatch) -> None:
    """What a subscriber's index does with a batch: the set of cached block hashes. Exact: a
    stored hash is new and a removed one present, so per-hash counts would agree with the set."""
    for event in batch.events:
        if isinstance(event, BlockStored):
            assert not state & set(event.block_hashes), "a hash announced twice"  # type: ignore[arg-type]
            state.update(event.block_hashes)  # type: ignore[arg-type]
        elif isinstance(event, BlockRemoved):
            assert set(event.block_hashes) <= state, "a hash removed that was not stored"  # type: ignore[arg-type]
            state.difference_update(event.block_hashes)
        else:
            state.clear()


def check_stored(event: BlockStored, block_size: int) -> None:
    """The hashes of a BlockStored are the engine's chain over exactly its token ids."""
    assert event.block_size == block_size
    assert len(event.token_ids) == len(event.block_hashes) * block_size
    salt = "lora:" + event.lora_name if event.lora_name else None
    parent = None if event.parent_block_hash is None else _signed(event.parent_block_hash)  # type: ignore[arg-type]
    expect = block_hashes(event.token_ids, block_size, salt=salt if parent is None else None,
                          parent=parent)
    assert [h & MASK64 for h in expect] == event.block_hashes


@dataclass
class Recorder:
    """A publisher that keeps the batches (and checks the set after each one)."""

    engine: Engine | None = None
    state: set[int] | None = None

    def __post_init__(self) -> None:
        self.batches: list[EventBatch] = []
        self.state = set()

    def publish(self, batch: EventBatch) -> bool:
        self.batches.append(batch)
        assert self.state is not None
        apply(self.state, batch)
        if self.engine is not None:  # after every batch the set is the pool's truth
            assert self.state == pool(self.engine)
        return True


def pool(engine: Engine) -> set[int]:
    return {h & MASK64 for h in engine.cache.cached_hashes()}


def make_engine(kv_blocks: int, block_size: int = 4, **limits: Any) -> tuple[Engine, Recorder]:
    rec = Recorder()
    journal = EventJournal(rec, block_size, lora_ids(["sql"]))
    engine = Engine(EngineLimits(block_size=block_size, kv_blocks=kv_blocks, **limits),
                    TimingModel(step_ms=0.0, prefill_us_per_token=0.0, decode_us_per_seq=0.0,
                                speed=1000.0), events=journal)
    rec.engine = engine
    return engine, rec


def prompts(rng: random.Random, n: int) -> list[list[int]]:
    """Prompts that share a few heads (hits), with tails that differ (misses, evictions)."""
    heads = [[rng.randrange(1000) for _ in range(rng.randrange(4, 24))] for _ in range(5)]
    return [rng.choice(heads) + [rng.randrange(1000) for _ in range(rng.randrange(1, 20))]
            for _ in range(n)]


def test_instant_requests_publish_exactly_the_pools_changes() -> None:
    engine, rec = make_engine(kv_blocks=24)
    rng = random.Random(7)
    for i, ids in enumerate(prompts(rng, 300)):
        lora = "sql" if i % 5 == 0 else None
        hashes = block_hashes(ids, 4, salt="lora:sql") if lora else None
        engine.serve_instant(EngineRequest(f"r{i}", ids, rng.randrange(1, 6), output_ids=[7, 8],
                                           prompt_hashes=hashes, lora=lora))
    assert engine.cache.evictions > 50  # the pool was small: evictions decided
    kinds = {type(e) for b in rec.batches for e in b.events}
    assert kinds == {BlockStored, BlockRemoved}
    for b in rec.batches:
        assert b.data_parallel_rank == 0
        for e in b.events:
            if isinstance(e, BlockStored):
                check_stored(e, 4)
                assert (e.lora_name, e.lora_id) in {(None, None), ("sql", 1)}
                assert e.medium == "GPU" and e.group_idx == 0
    assert rec.state == pool(engine)


def test_timed_engine_with_preemption_publishes_one_batch_per_step() -> None:
    engine, rec = make_engine(kv_blocks=20, max_num_seqs=6, max_num_batched_tokens=24)
    rng = random.Random(11)

    async def run() -> None:
        engine.start()
        handles = [engine.submit(EngineRequest(f"r{i}", ids, rng.randrange(2, 12)))
                   for i, ids in enumerate(prompts(rng, 60))]
        for h in handles[::7]:
            await asyncio.sleep(0)
            h.abort()  # aborts free blocks outside a step too
        for h in handles:
            await h.wait()
        await engine.stop()

    asyncio.run(asyncio.wait_for(run(), 60))
    assert engine.stats.preemptions > 0 and engine.cache.evictions > 0
    assert len(rec.batches) <= engine.stats.steps + engine.stats.aborts
    for b in rec.batches:
        for e in b.events:
            if isinstance(e, BlockStored):
                check_stored(e, 4)
    assert rec.state == pool(engine)


def test_a_hash_already_cached_is_not_announced_again() -> None:
    # instant: a repeated prompt's hit is capped below its last token, so its last full block is
    # registered again - into no new block: nothing to announce
    engine, rec = make_engine(kv_blocks=32)
    engine.serve_instant(EngineRequest("a", list(range(8)), 1))
    engine.serve_instant(EngineRequest("b", list(range(8)), 1))
    stored = [e for b in rec.batches for e in b.events if isinstance(e, BlockStored)]
    assert [len(e.block_hashes) for e in stored] == [2]

    # timed: two requests with one prompt admitted in the same step compute the same blocks;
    # the pool keeps the first copy and only it is announced
    engine, rec = make_engine(kv_blocks=32)

    async def run() -> None:
        engine.start()
        handles = [engine.submit(EngineRequest(r, list(range(100, 117)), 3)) for r in "cd"]
        for h in handles:
            await h.wait()
        await engine.stop()

    asyncio.run(asyncio.wait_for(run(), 30))
    hashes = [h for b in rec.batches for e in b.events if isinstance(e, BlockStored)
              for h in e.block_hashes]
    assert len(hashes) == len(set(hashes)) == len(pool(engine)) == 4  # 17 + 2 computed tokens
    assert rec.state == pool(engine)


def test_reset_publishes_all_blocks_cleared_and_is_refused_while_blocks_are_held() -> None:
    engine, rec = make_engine(kv_blocks=16)
    engine.serve_instant(EngineRequest("a", list(range(10)), 3))
    assert pool(engine)
    assert engine.reset_prefix_cache()
    assert isinstance(rec.batches[-1].events[-1], AllBlocksCleared)
    assert pool(engine) == set() == rec.state
    assert engine.serve_instant(EngineRequest("b", list(range(10)), 3)).cached_tokens == 0

    async def held() -> bool:
        engine.submit(EngineRequest("c", list(range(20)), 20))
        engine.schedule()  # admitted: its blocks are pinned
        return engine.reset_prefix_cache()

    assert asyncio.run(held()) is False


# -- config ---------------------------------------------------------------------------------------

def test_config_defaults_are_vllms() -> None:
    cfg = parse_kv_events_config("{}")
    assert (cfg.enable_kv_cache_events, cfg.publisher, cfg.endpoint, cfg.replay_endpoint,
            cfg.buffer_steps, cfg.hwm, cfg.max_queue_size, cfg.topic) == (
        False, "null", "tcp://*:5557", None, 10_000, 100_000, 100_000, "")
    assert not cfg.publishes
    assert parse_kv_events_config('{"enable_kv_cache_events": true}').publisher == "zmq"
    assert parse_kv_events_config(cfg.to_json()) == cfg


@pytest.mark.parametrize(("text", "message"), [
    ("{nope", "not JSON"),
    ("[]", "expected a JSON object"),
    ('{"enable_kv_cache_event": true}', "unknown key"),  # a typo is an error, not silence
    ('{"publisher": "kafka"}', "publisher"),
    ('{"buffer_steps": 0}', "buffer_steps"),
    ('{"hwm": -1}', "hwm"),
    ('{"endpoint": "5557"}', "endpoint"),
    ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events"),
])
def test_config_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_kv_events_config(text)
    with pytest.raises(ValueError, match=message):
        ReplicaConfig(kv_events_config=text)


def test_with_port_gives_each_replica_its_ports() -> None:
    cfg = KvEventsConfig(True, endpoint="tcp://*:5557", replay_endpoint="tcp://*:5558")
    got = with_port(cfg, 6000, 6001)
    assert (got.endpoint, got.replay_endpoint) == ("tcp://*:6000", "tcp://*:6001")
    assert with_port(KvEventsConfig(True), 6000, 6001).replay_endpoint is None


# -- the publisher on loopback --------------------------------------------------------------------

class Subscriber:
    """A real SUB socket plus a DEALER for replay requests, with bounded waits."""

    def __init__(self, pub: str, replay: str | None, topic: bytes = b"kv") -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(pub)
        self.sub.subscribe(topic)
        self.replay_endpoint = replay
        self.topic = topic

    def recv(self, timeout_ms: int = 5000) -> tuple[int, EventBatch] | None:
        if not self.sub.poll(timeout_ms):
            return None
        topic, seq, payload = self.sub.recv_multipart()
        assert topic == self.topic
        return decode_seq(seq), decode_batch(payload)

    def drain(self, quiet_ms: int = 300) -> list[tuple[int, EventBatch]]:
        out = []
        while (got := self.recv(quiet_ms)) is not None:
            out.append(got)
        return out

    def replay(self, start: int, frames: list[bytes] | None = None) -> list[tuple[int, EventBatch]]:
        assert self.replay_endpoint is not None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart(frames if frames is not None else [b"", encode_seq(start)])
            out = []
            for _ in range(100_000):
                assert dealer.poll(5000), "the replay endpoint did not answer"
                empty, topic, seq, payload = dealer.recv_multipart()
                assert empty == b""
                if decode_seq(seq) == REPLAY_END:
                    assert (topic, payload) == (b"", b"")
                    return out
                assert topic == self.topic
                out.append((decode_seq(seq), decode_batch(payload)))
            raise AssertionError("no replay end marker")
        finally:
            dealer.close(linger=0)

    def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()


def wait_subscribed(sub: Subscriber, poke: Callable[[], object],
                    tries: int = 50) -> tuple[int, EventBatch]:
    """PUB drops what it sends before a SUB's subscription arrives: poke until one batch comes
    through and return it (what came before is then fetched by replay)."""
    for _ in range(tries):
        poke()
        got = sub.recv(200)
        if got is not None:
            return got
    raise AssertionError("no KV event reached the subscriber")


def replayed(seen: dict[int, EventBatch]) -> set[int]:
    assert sorted(seen) == list(range(len(seen)))  # consecutive from 0: nothing lost
    state: set[int] = set()
    for seq in sorted(seen):
        apply(state, seen[seq])
    return state


@pytest.fixture
def kv_replica(threaded_server: Callable[..., Any]) -> Iterator[Callable[..., tuple[str, Subscriber]]]:
    subs: list[Subscriber] = []
    replicas: list[Replica] = []

    def start(**options: Any) -> tuple[str, Subscriber]:
        pub, replay = quiet_port(), quiet_port()
        options.setdefault("speed", 100.0)
        options["kv_events_config"] = json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv",
            "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}",
            **options.pop("kv", {})})
        replica = Replica(ReplicaConfig(**options))
        replicas.append(replica)
        url = threaded_server(replica).url
        sub = Subscriber(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}")
        subs.append(sub)
        return url, sub

    yield start
    for sub in subs:
        sub.close()
    for replica in replicas:
        replica.close()


def complete(url: str, ids: list[int], max_tokens: int = 2, model: str | None = None) -> int:
    body: dict[str, Any] = {"prompt": ids, "max_tokens": max_tokens}
    if model:
        body["model"] = model
    r = HTTP.post(url + "/v1/completions", json=body)
    r.raise_for_status()
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def engine_blocks(url: str) -> set[int]:
    return set(HTTP.get(url + "/admin/kv_blocks").json()["hashes"])


@pytest.mark.parametrize("instant", [False, True])
def test_subscriber_sees_the_pool_and_replay_fills_a_gap(
        kv_replica: Callable[..., tuple[str, Subscriber]], instant: bool) -> None:
    url, sub = kv_replica(kv_blocks=12, block_size=4, instant=instant)
    rng = random.Random(3)
    work = iter(prompts(rng, 10_000))
    first, batch = wait_subscribed(sub, lambda: complete(url, next(work)))
    # what PUB sent before the subscription took effect comes from replay
    seen = {s: b for s, b in sub.replay(0) if s < first}
    seen[first] = batch
    for _ in range(40):
        complete(url, next(work))
    seen.update(sub.drain())
    assert replayed(seen) == engine_blocks(url)
    assert any(isinstance(e, BlockRemoved) for b in seen.values() for e in b.events)

    # a gap: the subscriber is away for a while, then a batch arrives with a higher seq
    sub.sub.unsubscribe(b"kv")
    sub.drain(100)
    for _ in range(15):
        complete(url, next(work))
    sub.sub.subscribe(b"kv")
    last = max(seen)
    got_seq, _ = wait_subscribed(sub, lambda: complete(url, next(work)))
    assert got_seq > last + 1  # a gap
    missed = sub.replay(last + 1)
    assert [s for s, _ in missed] == list(range(last + 1, last + 1 + len(missed)))
    assert got_seq in dict(missed)
    seen.update(missed)
    seen.update(sub.drain())
    assert replayed(seen) == engine_blocks(url)


def test_lora_reset_and_token_ids(kv_replica: Callable[..., tuple[str, Subscriber]]) -> None:
    url, sub = kv_replica(kv_blocks=64, block_size=4, lora=["sql", "chat"])
    n = 0

    def poke() -> None:
        nonlocal n
        n += 1
        complete(url, [9000 + n] * 5)

    wait_subscribed(sub, poke)
    prompt = list(range(100, 111))  # 11 tokens + 2 generated: 3 full blocks (the last KV uncomputed)
    complete(url, prompt, max_tokens=2, model="chat")
    events = [e for _, b in sub.drain() for e in b.events]
    assert all(isinstance(e, BlockStored) for e in events)
    stored: list[BlockStored] = events  # type: ignore[assignment]
    assert stored[0].parent_block_hash is None
    assert {(e.lora_name, e.lora_id) for e in stored} == {("chat", 2)}
    tokens = [t for e in stored for t in e.token_ids]
    assert tokens[:11] == prompt and len(tokens) == 12  # the prompt's tokens, block by block
    for e in stored:
        check_stored(e, 4)

    assert HTTP.post(url + "/reset_prefix_cache").json() == {"success": True}
    (_, batch), = sub.drain()
    assert batch.events == [AllBlocksCleared()]
    assert engine_blocks(url) == set()
    stats = HTTP.get(url + "/admin/stats").json()["kv_events"]
    assert stats["published"] == stats["last_seq"] + 1
    assert stats["dropped"] == 0


def test_a_malformed_replay_request_is_ignored(kv_replica: Callable[..., tuple[str, Subscriber]]) -> None:
    url, sub = kv_replica(kv_blocks=32, block_size=4)
    n = iter(range(1000))  # a new prompt per poke: a repeated one stores no new block
    wait_subscribed(sub, lambda: complete(url, [next(n)] * 9))
    dealer = sub.ctx.socket(zmq.DEALER)
    dealer.connect(sub.replay_endpoint)
    dealer.send_multipart([b"", b"x", b"y"])  # four frames at the ROUTER: not a request
    assert not dealer.poll(300)
    dealer.close(linger=0)
    assert sub.replay(0)  # and the endpoint still answers


def test_publish_never_blocks_and_counts_what_it_drops() -> None:
    """The publisher thread is held inside an encode; a full queue refuses at once."""
    gate = threading.Event()
    entered = threading.Event()

    class Slow(float):
        def __float__(self) -> float:
            entered.set()
            gate.wait(10)
            return 1.0

    port = quiet_port()
    pub = ZmqPublisher(KvEventsConfig(True, endpoint=f"tcp://*:{port}", max_queue_size=2))
    try:
        assert pub.publish(EventBatch(Slow(1.0), []))
        assert entered.wait(10)  # the thread took the first batch and is stuck in it
        assert pub.queued == 0 and pub.unsent == 1  # off the queue, not sent: still unsent
        assert pub.publish(EventBatch(2.0, [])) and pub.publish(EventBatch(3.0, []))
        assert pub.unsent == 3
        assert [pub.publish(EventBatch(4.0, [])) for _ in range(5)] == [False] * 5
        assert pub.dropped == 5
        gate.set()
        for _ in range(500):
            if pub.published == 3:
                break
            threading.Event().wait(0.01)
        assert pub.published == 3 and pub.last_seq == 2 and pub.unsent == 0
    finally:
        gate.set()
        pub.close()


def test_a_taken_port_fails_at_start() -> None:
    port = quiet_port()
    first = ZmqPublisher(KvEventsConfig(True, endpoint=f"tcp://*:{port}"))
    try:
        with pytest.raises(OSError, match="cannot open"):
            ZmqPublisher(KvEventsConfig(True, endpoint=f"tcp://*:{port}"))
    finally:
        first.close()


# -- the fleet ------------------------------------------------------------------------------------

def test_a_fleet_gives_every_replica_its_own_ports_and_each_publishes() -> None:
    from loadtest.fleet import Fleet

    cfg = json.dumps({"enable_kv_cache_events": True, "topic": "kv",
                      "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"})
    with Fleet(replicas=2, instant=True, block_size=4, kv_blocks=64, kv_events_config=cfg) as fleet:
        assert len(set(fleet.kv_endpoints) | set(fleet.kv_replay_endpoints)) == 4
        for i, (url, pub, replay) in enumerate(zip(fleet.urls, fleet.kv_endpoints,
                                                   fleet.kv_replay_endpoints, strict=True)):
            assert pub is not None and replay is not None
            sub = Subscriber(pub, replay)
            try:
                prompt = [i] * 8 + list(range(9))
                complete(url, prompt)
                # replay from 0 holds everything this replica published, and only that
                events = [e for _, b in sub.replay(0) for e in b.events]
                assert [e.token_ids for e in events if isinstance(e, BlockStored)] == [
                    prompt[:16]]
                assert fleet.stats(i)["kv_events"]["replay_endpoint"].endswith(
                    replay.rsplit(":", 1)[1])
            finally:
                sub.close()


@pytest.mark.parametrize(("endpoint", "replay", "ports"), [
    ("tcp://*:5557", "tcp://*:6557", ([5557, 5558, 5559], [6557, 6558, 6559])),  # base + i
    ("tcp://*:5557", None, ([5557, 5558, 5559], [None] * 3)),  # no replay endpoint
])
def test_fleet_ports_are_the_configs_plus_i(endpoint: str, replay: str | None,
                                             ports: tuple[list[int], list[int | None]]) -> None:
    from loadtest.fleet import Fleet

    cfg = json.dumps({"enable_kv_cache_events": True, "endpoint": endpoint,
                      "replay_endpoint": replay})
    fleet = Fleet(replicas=3, kv_events_config=cfg)  # not started: the ports are chosen up front
    assert fleet.kv_endpoints == [f"tcp://127.0.0.1:{p}" for p in ports[0]]
    assert fleet.kv_replay_endpoints == [None if p is None else f"tcp://127.0.0.1:{p}"
                                         for p in ports[1]]


def test_fleet_ports_that_would_collide_are_refused() -> None:
    from loadtest.fleet import Fleet

    cfg = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://*:5557",
                      "replay_endpoint": "tcp://*:5558"})  # replica 1's PUB = replica 0's replay
    with pytest.raises(ValueError, match="overlap"):
        Fleet(replicas=2, kv_events_config=cfg)


def test_the_unbounded_pool_resets_too() -> None:
    from templates_audit.blocks import PrefixCache

    cache = PrefixCache(None, 4)
    hashes = block_hashes(list(range(12)), 4)
    cache.insert(hashes, 13)
    assert set(cache.cached_hashes()) == set(hashes)
    assert cache.reset() and cache.cached_hashes() == []
    assert cache.insert(hashes, 13) == 0 and set(cache.cached_hashes()) == set(hashes)


def test_the_replica_command_names_a_bad_config() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "loadtest", "replica", "--kv-events-config",
                           '{"enable_kv_cache_events": true, "topc": "kv"}'],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown key(s) topc" in proc.stderr
