"""PrefixCache equals the straightforward block-at-a-time implementation it replaced.

``ReferenceCache`` below is the earlier ``templates_audit.blocks.PrefixCache``, kept verbatim as the
specification: one Python step per block, no batching, no special case for a pool with nothing
pinned. Random operation sequences (sequential inserts as the auditor replays them, and
interleaved allocate/extend/cache/free of overlapping requests as the simulated replica runs
them, with small pools, shared prefixes, equal hashes and exhausted pools) must give identical
return values, counters (hits, queries, evictions), block ids, cache contents and eviction order.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

import pytest

from templates_audit import blocks
from templates_audit.blocks import Allocation, PrefixCache, block_hashes


class ReferenceCache:
    """The block-at-a-time PrefixCache this project shipped before the batched one (verbatim)."""

    def __init__(self, num_blocks: int | None, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        if num_blocks is not None and num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0 or None, got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._ref: list[int] = []
        self._hash: list[int | None] = []
        self._cached: dict[int, int] = {}  # block hash -> block id
        # Free blocks in eviction order (head evicted first). Never-used blocks come first.
        self._free: OrderedDict[int, None] = OrderedDict()
        self._spare: list[int] = []  # unbounded pool only: uncached blocks to recycle
        if num_blocks is not None:
            self._ref = [0] * num_blocks
            self._hash = [None] * num_blocks
            self._free = OrderedDict.fromkeys(range(num_blocks))
        self.hits = 0  # tokens, as vLLM's prefix_cache_hits counter
        self.queries = 0  # tokens, as vLLM's prefix_cache_queries counter
        self.evictions = 0

    # -- queries -----------------------------------------------------------------------------
    def _hit_blocks(self, hashes: Sequence[int], num_tokens: int) -> list[int]:
        limit = min(len(hashes), max(num_tokens - 1, 0) // self.block_size)
        found: list[int] = []
        cached = self._cached
        for i in range(limit):
            bid = cached.get(hashes[i])
            if bid is None:
                break
            found.append(bid)
        return found

    def cached_prefix_tokens(self, hashes: Sequence[int], num_tokens: int) -> int:
        """Tokens vLLM would take from the cache for a prompt of ``num_tokens`` with ``hashes``."""
        return len(self._hit_blocks(hashes, num_tokens)) * self.block_size

    @property
    def num_free(self) -> int:
        return len(self._free) if self.num_blocks is not None else 1 << 62

    @property
    def usage(self) -> float:
        if not self.num_blocks:
            return 0.0
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- allocation ----------------------------------------------------------------------------
    def _take_free(self) -> int:
        if self.num_blocks is None:  # unbounded: never evict, recycle uncached blocks
            if self._spare:
                return self._spare.pop()
            self._ref.append(0)
            self._hash.append(None)
            return len(self._ref) - 1
        bid, _ = self._free.popitem(last=False)
        old = self._hash[bid]
        if old is not None:
            if self._cached.get(old) == bid:
                del self._cached[old]
            self._hash[bid] = None
            self.evictions += 1
        return bid

    def allocate(self, hashes: Sequence[int], num_tokens: int, record: bool = True) -> Allocation | None:
        """Pin the cached prefix and allocate blocks for the rest of the prompt.

        Returns None (and changes nothing) when the pool cannot hold the request. ``record``
        counts the request in ``hits``/``queries`` (vLLM records once per scheduled request).
        """
        hit = self._hit_blocks(hashes, num_tokens)
        need = self.blocks_for(num_tokens) - len(hit)
        if self.num_blocks is not None:
            # Pinning a free hit block takes it out of the free queue: it is not spare.
            hit_free = sum(1 for b in hit if self._ref[b] == 0)
            if need > len(self._free) - hit_free:
                return None
        for b in hit:
            if self._ref[b] == 0:
                self._free.pop(b, None)
            self._ref[b] += 1
        blocks = list(hit)
        for _ in range(need):
            bid = self._take_free()
            self._ref[bid] = 1
            blocks.append(bid)
        hit_tokens = len(hit) * self.block_size
        if record:
            self.queries += num_tokens
            self.hits += hit_tokens
        return Allocation(blocks=blocks, num_tokens=num_tokens, hit_tokens=hit_tokens,
                          cached_upto=len(hit))

    def extend(self, alloc: Allocation, num_tokens: int) -> bool:
        """Grow ``alloc`` to hold ``num_tokens`` (decode). False when the pool is exhausted."""
        need = self.blocks_for(num_tokens) - len(alloc.blocks)
        if need > 0:
            if self.num_blocks is not None and need > len(self._free):
                return False
            for _ in range(need):
                bid = self._take_free()
                self._ref[bid] = 1
                alloc.blocks.append(bid)
        alloc.num_tokens = max(alloc.num_tokens, num_tokens)
        return True

    def cache_full_blocks(self, alloc: Allocation, hashes: Sequence[int]) -> None:
        """Register the computed full blocks of ``alloc`` (prompt and generated) for reuse."""
        upto = min(len(hashes), len(alloc.blocks))
        for i in range(alloc.cached_upto, upto):
            h = hashes[i]
            bid = alloc.blocks[i]
            if h in self._cached or self._hash[bid] is not None:
                continue  # an identical block is already cached (vLLM keeps the first)
            self._hash[bid] = h
            self._cached[h] = bid
        alloc.cached_upto = max(alloc.cached_upto, upto)

    def free(self, alloc: Allocation) -> None:
        """Release ``alloc``; its cached blocks stay reusable until evicted (tail first)."""
        if alloc.freed:
            return
        alloc.freed = True
        for bid in reversed(alloc.blocks):
            self._ref[bid] -= 1
            if self._ref[bid] == 0:
                if self.num_blocks is not None:
                    self._free[bid] = None
                elif self._hash[bid] is None:
                    self._spare.append(bid)

    def insert(self, hashes: Sequence[int], num_tokens: int, record: bool = True) -> int:
        """Serve one request start to finish (allocate, cache its full blocks, free); its hit tokens.

        The auditor's projection of one replica is a loop over this call in trace order.
        """
        alloc = self.allocate(hashes, num_tokens, record=record)
        if alloc is None:
            return 0
        self.cache_full_blocks(alloc, hashes)
        self.free(alloc)
        return alloc.hit_tokens


def _ref_insert(ref: ReferenceCache, hashes: list[int], num_tokens: int, record: bool = True,
                hit_limit: int | None = None) -> int:
    """``PrefixCache.insert``'s ``hit_limit`` on the reference: a capped allocation, then every
    full block cached (how the simulated replica serves a request whose full blocks include
    generated tokens)."""
    if hit_limit is None:
        return ref.insert(hashes, num_tokens, record=record)
    alloc = ref.allocate(hashes[:hit_limit], num_tokens, record=record)
    if alloc is None:
        return 0
    ref.cache_full_blocks(alloc, hashes)
    ref.free(alloc)
    return alloc.hit_tokens


def _limit(rng: random.Random, hashes: list[int]) -> int | None:
    return rng.choice([None, None, 0, len(hashes), max(len(hashes) - 1, 0),
                       rng.randrange(len(hashes) + 1)])


def _state(c: PrefixCache | ReferenceCache) -> tuple[object, ...]:
    """Everything observable: counters, cache contents (hash -> block), free queue or spare list."""
    free = list(c._free) if c.num_blocks is not None else list(c._spare)
    return c.hits, c.queries, c.evictions, dict(c._cached), free, c.num_free, c.usage


def _prompts(rng: random.Random, bs: int) -> list[list[int]]:
    """Prompts that share prefixes of various lengths (chained hashes hit, then diverge)."""
    stems = [[rng.randrange(50) for _ in range(rng.randrange(1, 14 * bs))] for _ in range(5)]
    out = []
    for _ in range(40):
        stem = rng.choice(stems)
        cut = rng.randrange(len(stem) + 1)
        out.append(stem[:cut] + [rng.randrange(50) for _ in range(rng.randrange(0, 3 * bs))])
    return out


def _hashes(rng: random.Random, ids: list[int], bs: int) -> list[int]:
    hs = block_hashes(ids, bs)
    if len(hs) >= 2 and rng.random() < 0.05:  # equal hashes in one request (API allows it)
        i, j = rng.sample(range(len(hs)), 2)
        hs[j] = hs[i]
    return hs


SEEDS = range(20)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("num_blocks", [None, 3, 8, 24, 64])
# blocks per lookup pass of the hit search; most blocks handled by plain loops (64: every
# request of these traces, 1: almost none)
@pytest.mark.parametrize(("scan", "small"), [(16, 8), (3, 8), (16, 64), (16, 1)])
def test_sequential_inserts_equal_the_reference(seed: int, num_blocks: int | None, scan: int,
                                                small: int, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    monkeypatch.setattr(blocks, "_SCAN", scan)
    monkeypatch.setattr(blocks, "_SMALL", small)
    rng = random.Random(seed * 1000 + (num_blocks or 0))
    bs = rng.choice([1, 2, 4])
    new, ref = PrefixCache(num_blocks, bs), ReferenceCache(num_blocks, bs)
    prompts = _prompts(rng, bs)
    for _ in range(150):
        ids = rng.choice(prompts)
        hs = _hashes(rng, ids, bs)
        n = len(ids) + rng.choice([0, 0, 1, 5])
        hs = hs[: rng.choice([len(hs), len(hs), max(len(hs) - 1, 0)])]
        record = rng.random() < 0.7
        limit = _limit(rng, hs)
        assert (new.insert(hs, n, record=record, hit_limit=limit)
                == _ref_insert(ref, hs, n, record=record, hit_limit=limit))
        assert _state(new) == _state(ref)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("num_blocks", [None, 6, 16, 48])
def test_interleaved_requests_equal_the_reference(seed: int, num_blocks: int | None) -> None:
    """The replica's use: overlapping requests pin blocks (some twice), decode, cache, free."""
    rng = random.Random(seed * 7919 + (num_blocks or 0))
    bs = rng.choice([1, 2, 4])
    new, ref = PrefixCache(num_blocks, bs), ReferenceCache(num_blocks, bs)
    prompts = _prompts(rng, bs)
    running: list[tuple[Allocation, Allocation, list[int]]] = []
    for _ in range(200):
        op = rng.random()
        if op < 0.35 or not running:
            ids = list(rng.choice(prompts))
            hs = _hashes(rng, ids, bs)
            a, b = new.allocate(hs, len(ids)), ref.allocate(hs, len(ids))
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert (a.blocks, a.hit_tokens, a.cached_upto) == (b.blocks, b.hit_tokens,
                                                                   b.cached_upto)
                running.append((a, b, ids))
        elif op < 0.5:
            a, b, ids = rng.choice(running)
            grow = rng.randrange(1, 3 * bs)
            ids.extend(rng.randrange(50) for _ in range(grow))
            n = a.num_tokens + grow
            assert new.extend(a, n) == ref.extend(b, n)
            assert (a.blocks, a.num_tokens) == (b.blocks, b.num_tokens)
        elif op < 0.7:
            a, b, ids = rng.choice(running)
            hs = _hashes(rng, ids, bs)[: rng.randrange(len(ids) // bs + 1)]
            new.cache_full_blocks(a, hs)
            ref.cache_full_blocks(b, hs)
            assert a.cached_upto == b.cached_upto
        elif op < 0.9:
            a, b, ids = running.pop(rng.randrange(len(running)))
            new.free(a)
            ref.free(b)
            new.free(a)  # twice is harmless
        else:
            ids = list(rng.choice(prompts))
            hs = _hashes(rng, ids, bs)
            limit = _limit(rng, hs)
            assert (new.insert(hs, len(ids), hit_limit=limit)
                    == _ref_insert(ref, hs, len(ids), hit_limit=limit))
        assert _state(new) == _state(ref)
    for a, b, _ in running:
        new.free(a)
        ref.free(b)
    assert _state(new) == _state(ref)
