"""Real vLLM's KV cache events: enabled on the stage's replicas, received, decoded by our codec.

The session fleet runs with ``--kv-events-config`` (tests/vllm/conftest.py, ``kv_events=True``).
A real ZMQ SUB socket subscribes to replica 0; a chat request is served; the ``BlockStored``
events that follow must carry exactly the prompt's tokens (vLLM's own ``/tokenize``), block by
block, and chain: the next turn's first new block names the previous turn's last block as its
parent. The simulated replica, given the same tokenizer and chat template, must publish the same
token ids. ``/reset_prefix_cache`` yields ``AllBlocksCleared`` (vLLM 0.32.0 publishes it with its
next engine step, so a request follows the reset), and the replay ROUTER answers with consecutive
batches and the end marker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadtest._net import quiet_port
from loadtest.replica import Replica, ReplicaConfig
from loadtest.vllm_fleet import VllmFleet
from router.kv_events.wire import AllBlocksCleared, BlockStored, EventBatch
from tests.conftest import ThreadedServer
from tests.loadtest.test_replica_kv_events import Subscriber, wait_subscribed

from ._prompts import prose

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

MODEL = "tiny-llama"


def post(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    resp = httpx.post(url + path, json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def chat(url: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    return post(url, "/v1/chat/completions", {"model": MODEL, "messages": messages,
                                               "max_tokens": 1})  # type: ignore[no-any-return]


def stored_until(sub: Subscriber, tokens: int, tries: int = 60) -> list[BlockStored]:
    """The BlockStored events that arrive until they cover ``tokens`` tokens (bounded)."""
    got: list[BlockStored] = []
    for _ in range(tries):
        if sum(len(e.token_ids) for e in got) >= tokens:
            return got
        batch = sub.recv(1000)
        if batch is not None:
            got += [e for e in batch[1].events if isinstance(e, BlockStored)]
    raise AssertionError(f"BlockStored covered {sum(len(e.token_ids) for e in got)} of "
                         f"{tokens} tokens")


def conversation(unique: str) -> list[list[dict[str, str]]]:
    """Two turns; the unique marker opens the system prompt, so block 0 is new to the replica."""
    system = {"role": "system", "content": unique + " " + prose(f"{unique}-kv-sys", 160)}
    first = [system, {"role": "user", "content": prose(f"{unique}-kv-q0", 20)}]
    second = [*first, {"role": "assistant", "content": prose(f"{unique}-kv-a0", 30)},
              {"role": "user", "content": prose(f"{unique}-kv-q1", 20)}]
    return [first, second]


Turn = tuple[list[int], int, list[BlockStored]]


def served_events(url: str, sub: Subscriber, turns: list[list[dict[str, str]]],
                  block_size: int) -> list[Turn]:
    """(the prompt's token ids, its leading full blocks the previous turn cached, the
    BlockStored events it caused) for each turn in order."""
    out: list[Turn] = []
    for messages in turns:
        ids = post(url, "/tokenize", {"model": MODEL, "messages": messages})["tokens"]
        usage = chat(url, messages)["usage"]
        assert usage["prompt_tokens"] == len(ids)
        before = out[-1][0] if out else []
        shared = 0
        while ((shared + 1) * block_size <= min(len(before), len(ids))
               and before[:(shared + 1) * block_size] == ids[:(shared + 1) * block_size]):
            shared += 1
        assert ((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) == \
            shared * block_size
        new_tokens = (len(ids) // block_size - shared) * block_size
        out.append((ids, shared, stored_until(sub, new_tokens)))
    return out


def check(turns: list[Turn], block_size: int) -> None:
    """Every BlockStored carries the prompt's own tokens, block by block, and the chain holds."""
    hashes: list[int | bytes] = []  # the prompt's full blocks, as the events named them
    for ids, shared, events in turns:
        del hashes[shared:]  # the next turn continues after the blocks it shares
        start = len(hashes)
        for e in events:
            assert e.block_size == block_size
            assert len(e.token_ids) == len(e.block_hashes) * block_size
            assert e.parent_block_hash == (hashes[-1] if hashes else None)
            hashes += e.block_hashes
        tokens = [t for e in events for t in e.token_ids]
        assert tokens == ids[start * block_size:len(hashes) * block_size]
        assert len(hashes) == len(ids) // block_size


@pytest.fixture
def subscriber(fleet: VllmFleet) -> Iterator[Subscriber]:
    assert fleet.kv_endpoints, "the stage's fleet runs with KV events on (conftest.py)"
    sub = Subscriber(fleet.kv_endpoints[0], fleet.kv_replay_endpoints[0])
    try:
        n = iter(range(1000))
        wait_subscribed(sub, lambda: post(fleet.urls[0], "/v1/completions", {
            "model": MODEL, "prompt": prose(f"poke-{time.time()}-{next(n)}", 40),
            "max_tokens": 1}), tries=30)
        sub.drain(500)
        yield sub
    finally:
        sub.close()


@pytest.fixture
def sim_subscriber(fleet: VllmFleet) -> Iterator[tuple[str, Subscriber]]:
    model = fleet.env.model_dir
    pub, replay = quiet_port(), quiet_port()
    replica = Replica(ReplicaConfig(
        model=MODEL, block_size=fleet.block_size, kv_blocks=512, instant=True,
        tokenizer=str(model / "tokenizer.json"), chat_template=str(model / "chat_template.jinja"),
        kv_events_config=json.dumps({"enable_kv_cache_events": True, "topic": "kv",
                                     "endpoint": f"tcp://*:{pub}",
                                     "replay_endpoint": f"tcp://*:{replay}"})))
    sub = Subscriber(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}")
    try:
        with ThreadedServer(replica) as server:
            n = iter(range(1000))
            wait_subscribed(sub, lambda: post(server.url, "/v1/completions", {
                "model": MODEL, "prompt": prose(f"sim-poke-{next(n)}", 40), "max_tokens": 1}))
            sub.drain(300)
            yield server.url, sub
    finally:
        sub.close()
        replica.close()


def test_vllm_publishes_the_prompts_blocks_and_the_simulator_the_same(
        fleet: VllmFleet, subscriber: Subscriber, sim_subscriber: tuple[str, Subscriber],
        unique: str) -> None:
    turns = conversation(unique)
    real = served_events(fleet.urls[0], subscriber, turns, fleet.block_size)
    check(real, fleet.block_size)
    first = real[0][2][0]
    print(f"\nvLLM BlockStored: {len(real[0][2]) + len(real[1][2])} events, "
          f"medium {first.medium!r}, group_idx {first.group_idx}, "
          f"kv_cache_spec_kind {first.kv_cache_spec_kind!r}, hash type "
          f"{type(first.block_hashes[0]).__name__}")
    assert first.lora_name is None and first.medium == "GPU"

    sim_url, sim_sub = sim_subscriber
    sim = served_events(sim_url, sim_sub, turns, fleet.block_size)
    check(sim, fleet.block_size)
    # the same prompts, the same tokens announced block by block (the hashes differ: each
    # engine hashes its own way)
    assert [(ids, shared) for ids, shared, _ in sim] == [(ids, shared) for ids, shared, _ in real]
    assert [[t for e in ev for t in e.token_ids] for _, _, ev in sim] == [
        [t for e in ev for t in e.token_ids] for _, _, ev in real]


def test_reset_clears_and_replay_answers(fleet: VllmFleet, subscriber: Subscriber,
                                         unique: str) -> None:
    url = fleet.urls[0]
    for _ in range(100):  # vLLM refuses a reset while requests hold blocks
        if fleet.metrics(0).get("vllm:num_requests_running", 0) == 0:
            break
        time.sleep(0.1)
    assert post(url, "/reset_prefix_cache") == {"success": True}
    # vLLM 0.32.0 queues AllBlocksCleared in its block pool and publishes it with the next step
    post(url, "/v1/completions", {"model": MODEL, "prompt": unique + " " + prose(unique, 60),
                                  "max_tokens": 1})
    events: list[Any] = []
    for _ in range(30):  # bounded: until the clear and a new prompt's first blocks came
        if AllBlocksCleared() in events and any(
                isinstance(e, BlockStored) and e.parent_block_hash is None
                for e in events[events.index(AllBlocksCleared()):]):
            break
        got = subscriber.recv(1000)
        if got is not None:
            events += got[1].events
    else:
        raise AssertionError(f"no AllBlocksCleared then BlockStored after the reset: {events}")

    replayed: list[tuple[int, EventBatch]] = subscriber.replay(0)
    seqs = [s for s, _ in replayed]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # consecutive, ends with the marker
    assert any(AllBlocksCleared() in b.events for _, b in replayed)


class CountIndex:
    """A subscriber's index of one replica as per-hash counts (vLLM may hold two copies of a
    hash: each copy is stored and removed on its own; docs/kv-events.md)."""

    def __init__(self) -> None:
        self.counts: dict[int | bytes, int] = {}
        self.removed = 0

    def apply(self, batch: EventBatch) -> None:
        for e in batch.events:
            if isinstance(e, BlockStored):
                for h in e.block_hashes:
                    self.counts[h] = self.counts.get(h, 0) + 1
            elif isinstance(e, AllBlocksCleared):
                self.counts.clear()
            else:
                self.removed += len(e.block_hashes)
                for h in e.block_hashes:
                    assert self.counts.get(h, 0) > 0, "vLLM removed a hash it never stored"
                    self.counts[h] -= 1
                    if not self.counts[h]:
                        del self.counts[h]

    def leading(self, hashes: list[int | bytes]) -> int:
        n = 0
        while n < len(hashes) and hashes[n] in self.counts:
            n += 1
        return n


def test_events_follow_evictions_and_predict_vllms_cached_tokens(
        fleet: VllmFleet, subscriber: Subscriber, unique: str) -> None:
    """Prompts worth more than the replica's 512 blocks, after a reset: vLLM evicts and says so,
    and an index fed only by its events predicts the cached_tokens vLLM then reports."""
    url, bs = fleet.urls[0], fleet.block_size
    for _ in range(100):  # vLLM refuses a reset while requests hold blocks
        if fleet.metrics(0).get("vllm:num_requests_running", 0) == 0:
            break
        time.sleep(0.1)
    assert post(url, "/reset_prefix_cache") == {"success": True}
    index = CountIndex()
    # the part number opens each prompt: the marker alone can fill block 0 (a hex uuid is 20-34
    # tokens), and a block 0 shared by the six would be cached once and stored once
    prompts = [f"part {k} of {unique} " + prose(f"{unique}-evict-{k}", 1250) for k in range(6)]
    hashes: list[list[int | bytes]] = []
    lengths: list[int] = []
    for k, prompt in enumerate(prompts):
        ids = post(url, "/tokenize", {"model": MODEL, "prompt": prompt})["tokens"]
        assert 2800 < len(ids) < fleet.max_model_len, len(ids)
        post(url, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
        stored: list[BlockStored] = []
        for _ in range(60):  # this prompt's blocks, in order (requests run one at a time)
            if sum(len(e.block_hashes) for e in stored) >= len(ids) // bs:
                break
            got = subscriber.recv(1000)
            if got is not None:
                index.apply(got[1])
                stored += [e for e in got[1].events if isinstance(e, BlockStored)]
        else:
            raise AssertionError(f"prompt {k}: its BlockStored did not all arrive")
        assert [t for e in stored for t in e.token_ids] == ids[:len(ids) // bs * bs]
        hashes.append([h for e in stored for h in e.block_hashes])
        lengths.append(len(ids))
    assert index.removed > 0, "no BlockRemoved although the prompts overflow the KV cache"
    assert len(index.counts) <= 512
    # what the index says of each prompt now, against what vLLM reports when it is sent again
    # (the first prompt, evicted first, is re-sent first; each re-send changes the cache, so the
    # index follows its events before predicting the next one)
    checked = []
    for k in (0, 5):
        predicted = min(index.leading(hashes[k]), (lengths[k] - 1) // bs) * bs
        usage = post(url, "/v1/completions", {"model": MODEL, "prompt": prompts[k],
                                              "max_tokens": 1})["usage"]
        reported = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        checked.append((k, predicted, reported))
        marker = prose(f"{unique}-sync-{k}", 60)  # its BlockStored marks the end of the stream
        mark_ids = post(url, "/tokenize", {"model": MODEL, "prompt": marker})["tokens"]
        post(url, "/v1/completions", {"model": MODEL, "prompt": marker, "max_tokens": 1})
        for _ in range(60):
            got = subscriber.recv(1000)
            assert got is not None, "the stream stopped"
            index.apply(got[1])
            if any(isinstance(e, BlockStored) and e.token_ids[:bs] == mark_ids[:bs]
                   for e in got[1].events):
                break
    print(f"\nKV events after evictions: {index.removed} blocks removed; "
          f"(prompt, predicted, reported cached tokens): {checked}")
    assert [p for _, p, _ in checked] == [r for _, _, r in checked]
    assert checked[1][1] > 0  # the latest prompt is still (partly) cached
