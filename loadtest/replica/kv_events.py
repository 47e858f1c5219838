"""The engine's block-pool changes as vLLM's KV cache events (the `engine.BlockEvents` it feeds).

`EventJournal` turns each change into the event vLLM 0.32.0 emits for it and hands one
`EventBatch` per engine step to a publisher (`kv_publisher.ZmqPublisher`):

- blocks a request registers -> one ``BlockStored`` (their hashes, the hash of the block before
  them or None at the start of a prompt, their token ids, ``block_size``, and for a LoRA request
  ``lora_name`` and ``lora_id``, the adapter's 1-based position among ``--lora`` as vLLM numbers
  ``--lora-modules``);
- hashes evicted to make room -> one ``BlockRemoved`` per eviction (vLLM sends one per block:
  the same set of hashes, fewer events);
- ``reset_prefix_cache`` -> ``AllBlocksCleared``.

Hashes go out as vLLM's default int form, the low 64 bits as an unsigned integer (the engine's
chained hashes are signed Python ints). ``medium`` is "GPU" and ``group_idx`` 0, as vLLM fills
them for an ordinary model. The timestamp is wall-clock time at the end of the step.

Cost: O(blocks + tokens) of the changes per step, paid only when KV events are on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from router.kv_events.wire import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
)

__all__ = ["MASK64", "EventJournal", "Publisher", "lora_ids"]

MASK64 = (1 << 64) - 1


class Publisher(Protocol):
    def publish(self, batch: EventBatch) -> bool:
        """Queue ``batch``; never blocks (False: dropped)."""
        ...


def lora_ids(adapters: Sequence[str]) -> dict[str, int]:
    """vLLM's adapter ids: 1, 2, ... in the order the adapters are served."""
    return {name: i for i, name in enumerate(adapters, start=1)}


class EventJournal:
    """Collects one engine step's events; ``flush`` publishes them as one batch (if any)."""

    def __init__(self, publisher: Publisher, block_size: int,
                 adapters: Mapping[str, int] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.publisher = publisher
        self.block_size = block_size
        self.adapters = dict(adapters or {})
        self.clock = clock
        self.pending: list[Event] = []
        self.batches = 0   # handed to the publisher (accepted or dropped)

    def stored(self, hashes: Sequence[int], parent: int | None, token_ids: Sequence[int],
               lora: str | None) -> None:
        self.pending.append(BlockStored(
            block_hashes=[h & MASK64 for h in hashes],
            parent_block_hash=None if parent is None else parent & MASK64,
            token_ids=list(token_ids), block_size=self.block_size,
            lora_id=self.adapters.get(lora) if lora is not None else None,
            medium=MEDIUM_GPU, lora_name=lora, group_idx=0))

    def removed(self, hashes: list[int]) -> None:
        if hashes:
            self.pending.append(BlockRemoved(block_hashes=[h & MASK64 for h in hashes],
                                             medium=MEDIUM_GPU, group_idx=0))

    def cleared(self) -> None:
        self.pending.append(AllBlocksCleared())

    def flush(self) -> None:
        if not self.pending:
            return
        batch = EventBatch(ts=self.clock(), events=self.pending, data_parallel_rank=0)
        self.pending = []
        self.batches += 1
        self.publisher.publish(batch)
