"""Which replica likely holds how much of a request's prompt: the approximate prefix index.

`PrefixIndex` is the extension point the routing pipeline reads (``match``) and the proxy's
outcome writes (``record``). `ApproxIndex` is the implementation used today: it learns only
from what this router process sent where. A precise index fed by vLLM's KV-cache events can
replace it behind the same protocol.

`ApproxIndex` keeps, per replica, an LRU of the chunk hashes (`router.chunks`) of the requests
that replica served, each weighted by its estimated tokens:

- ``record(replica, chunks)`` is called once the replica's response started (the prompt has
  been prefilled there, so vLLM holds its blocks). A request that failed on a replica never
  reaches it, so a retry indexes only the replica that answered. Chunks are touched deepest
  first, so a request's first chunk is its most recent entry: the LRU evicts the tail of a
  prompt before its shared head, as vLLM's free-block queue does.
- Each replica's entries weigh at most its KV capacity in tokens (``set_capacity``:
  ``num_gpu_blocks x block_size`` from the replica's ``vllm:cache_config_info``, else the
  configured fallback), and at most ``max_entries`` entries; past either bound the oldest
  entries go. Old entries therefore age out about when vLLM evicts the blocks.
- ``match(chunks)`` walks the request's chunks from the first and returns, for every replica
  holding a prefix of them, the estimated tokens of its longest one (chunk hashes are chained,
  so holding chunk k means holding the prompt up to k).

Invariants: an entry exists for a replica only if that replica answered a request containing
it; a replica's weight never exceeds its capacity after ``record``; ``forget`` drops a replica
that left the membership entirely.

Memory: each entry costs one slot in the replica's OrderedDict and one in the shared
hash -> holders map (about 350 bytes together on CPython; scripts/bench_index.py measures it),
so the index holds at most
``sum(min(capacity_r / chunk tokens, max_entries))`` entries, whatever the number of requests.

Cost: ``match`` is O(chunks + holders) dict lookups and set intersections, stopping at the first
chunk nobody holds; ``record`` is O(chunks) dict operations plus the evictions it causes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from typing import Protocol

from router.chunks import Chunks

__all__ = ["ApproxIndex", "InFlight", "PrefixIndex", "match_holders"]


class PrefixIndex(Protocol):
    def match(self, chunks: Chunks) -> Mapping[str, int]:
        """Replica -> estimated prompt tokens of the longest prefix of ``chunks`` it holds
        (replicas holding nothing are absent)."""
        ...

    def record(self, replica: str, chunks: Chunks) -> None:
        """``replica`` served a request with these chunks (it now caches them)."""
        ...

    def set_capacity(self, replica: str, tokens: int) -> None:
        """The replica's KV-cache capacity in tokens (evicts down to it)."""
        ...

    def forget(self, replica: str) -> None:
        """Drop everything known about ``replica``."""
        ...

    def inserted(self, replica: str) -> float:
        """New (uncached) tokens recently written for ``replica``: its eviction pressure."""
        ...

    def used(self, replica: str) -> int:
        """Tokens the index counts as cached on ``replica`` (its capacity at most)."""
        ...


def match_holders(holders: Mapping[int, Collection[str]], chunks: Chunks) -> dict[str, int]:
    """Replica -> tokens of its longest prefix of ``chunks``, given hash -> holders."""
    hashes, tokens = chunks.hashes, chunks.tokens
    out: dict[str, int] = {}
    alive: set[str] | None = None
    depth = 0
    for i, h in enumerate(hashes):
        held = holders.get(h)
        if not held:
            break
        if alive is None:
            alive = set(held)
        else:
            kept = alive.intersection(held)
            if len(kept) < len(alive):
                for name in alive - kept:
                    out[name] = tokens[i - 1]
            alive = kept
            if not alive:
                break
        depth = i
    if alive:
        last = tokens[depth]
        for name in alive:
            out[name] = last
    return out


class InFlight:
    """The chunks of requests dispatched to a replica whose response has not started yet.

    A burst of requests with the same new prefix would otherwise look cold everywhere until the
    first one's prefill finished, and spread over replicas that each prefill it again. Matching
    these too (the pipeline also counts their pending prefill as queued work on the replica)
    sends the burst to the replica computing the prefix, and ``leader`` names the request
    computing it there, so the router can hold the others until that prefill is done
    (`router.routing.Routed.leader`). Each chunk keeps its owners per replica in dispatch order
    (any hashable object: the router passes its `Routed`); ``remove`` drops one, so a failed
    request leaves nothing behind. Bounded by the requests in flight. Cost as
    `ApproxIndex.match` / ``record`` without eviction; ``leader`` is O(chunks).
    """

    def __init__(self) -> None:
        self._holders: dict[int, dict[str, list[object]]] = {}

    def match(self, chunks: Chunks) -> dict[str, int]:
        return match_holders(self._holders, chunks)

    def leader(self, chunks: Chunks, replica: str) -> tuple[object, int] | None:
        """The earliest owner still in flight on ``replica`` of the longest prefix of
        ``chunks`` in flight there, and that prefix's tokens; None when there is none."""
        holders = self._holders
        hashes = chunks.hashes
        found = None
        for i, h in enumerate(hashes):
            owners = holders.get(h, {}).get(replica)
            if not owners:
                break
            found = (owners[0], chunks.tokens[i])
        return found

    def add(self, replica: str, chunks: Chunks, owner: object = None) -> None:
        holders = self._holders
        for h in chunks.hashes:
            held = holders.get(h)
            if held is None:
                holders[h] = {replica: [owner]}
            else:
                owners = held.get(replica)
                if owners is None:
                    held[replica] = [owner]
                else:
                    owners.append(owner)

    def remove(self, replica: str, chunks: Chunks, owner: object = None) -> None:
        holders = self._holders
        for h in chunks.hashes:
            held = holders.get(h)
            if held is None:
                continue
            owners = held.get(replica)
            if not owners:
                continue
            try:
                owners.remove(owner)
            except ValueError:
                continue
            if not owners:
                del held[replica]
                if not held:
                    del holders[h]

    def __len__(self) -> int:
        return len(self._holders)


class _Replica:
    __slots__ = ("capacity", "entries", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[int, int] = OrderedDict()  # hash -> tokens, oldest first
        self.used = 0


class ApproxIndex:
    """Per-replica token-weighted LRU of chunk hashes, plus the shared hash -> holders map."""

    def __init__(self, default_capacity: int, max_entries: int = 1 << 16) -> None:
        if default_capacity < 1 or max_entries < 1:
            raise ValueError("capacity and max_entries must be >= 1")
        self.default_capacity = default_capacity
        self.max_entries = max_entries
        self._replicas: dict[str, _Replica] = {}
        self._holders: dict[int, set[str]] = {}
        self._inserted: dict[str, float] = {}
        self._inserted_total = 0.0

    def _get(self, replica: str) -> _Replica:
        r = self._replicas.get(replica)
        if r is None:
            r = self._replicas[replica] = _Replica(self.default_capacity)
        return r

    def match(self, chunks: Chunks) -> dict[str, int]:
        return match_holders(self._holders, chunks)

    def record(self, replica: str, chunks: Chunks) -> None:
        hashes, tokens = chunks.hashes, chunks.tokens
        if not hashes:
            return
        r = self._get(replica)
        entries, holders = r.entries, self._holders
        new = 0
        for i in range(len(hashes) - 1, -1, -1):
            h = hashes[i]
            if h in entries:
                entries.move_to_end(h)
                continue
            weight = tokens[i] - (tokens[i - 1] if i else 0)
            entries[h] = weight
            r.used += weight
            new += weight
            held = holders.get(h)
            if held is None:
                holders[h] = {replica}
            else:
                held.add(replica)
        self._evict(replica, r)
        if new:
            self._count_inserted(replica, new)

    def _count_inserted(self, replica: str, tokens: int) -> None:
        """Recent insertions per replica: halved whenever the total passes the fleet's
        capacity, so they cover roughly the last one to two fleet-fulls of new content."""
        ins = self._inserted
        ins[replica] = ins.get(replica, 0.0) + tokens
        self._inserted_total += tokens
        horizon = sum(r.capacity for r in self._replicas.values())
        if self._inserted_total > horizon:
            for name in ins:
                ins[name] /= 2
            self._inserted_total /= 2

    def inserted(self, replica: str) -> float:
        return self._inserted.get(replica, 0.0)

    def _evict(self, replica: str, r: _Replica) -> None:
        entries, holders = r.entries, self._holders
        while entries and (r.used > r.capacity or len(entries) > self.max_entries):
            h, weight = entries.popitem(last=False)
            r.used -= weight
            held = holders.get(h)
            if held is not None:
                held.discard(replica)
                if not held:
                    del holders[h]

    def set_capacity(self, replica: str, tokens: int) -> None:
        r = self._get(replica)
        if tokens >= 1 and tokens != r.capacity:
            r.capacity = tokens
            self._evict(replica, r)

    def forget(self, replica: str) -> None:
        r = self._replicas.pop(replica, None)
        self._inserted_total -= self._inserted.pop(replica, 0.0)
        if r is None:
            return
        for h in r.entries:
            held = self._holders.get(h)
            if held is not None:
                held.discard(replica)
                if not held:
                    del self._holders[h]

    def retain(self, replicas: Iterable[str]) -> None:
        """Forget every replica not in ``replicas``."""
        keep = set(replicas)
        for name in [n for n in self._replicas if n not in keep]:
            self.forget(name)

    def stats(self) -> dict[str, int]:
        """Entries and estimated cached tokens per replica (for tests and the memory report)."""
        return {name: len(r.entries) for name, r in self._replicas.items()}

    def used(self, replica: str) -> int:
        r = self._replicas.get(replica)
        return 0 if r is None else r.used
