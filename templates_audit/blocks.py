"""vLLM's prefix-cache block arithmetic — the project's single implementation.

The simulated replica (``loadtest.replica``) and the auditor (``templates_audit.analysis``) both use
this module, so a hit the auditor projects is exactly a hit the simulator serves.

What vLLM (V1 engine, ``--enable-prefix-caching``) does, and what this module reproduces:

* A prompt's token ids are cut into blocks of ``block_size`` tokens. Only **full** blocks are hashed
  and cached; a partial last block is never reused.
* Block hashes are **chained**: block *i*'s hash covers its own tokens and block *i-1*'s hash, so
  the same 16 tokens after a different prefix hash differently (a miss). Here the chain is
  ``h_i = hash((h_{i-1}, tokens_i))`` — CPython's tuple hash over ints, which is deterministic
  across processes (ints are not randomised by PYTHONHASHSEED) and about twice as fast as packing
  the ids for xxh3 — with the first seed derived from an optional cache salt (vLLM's
  ``cache_salt``). vLLM uses sha256 (or its builtin-hash option, the same idea as here); the hash
  function differs, the equality relation between blocks is the same.
* A request's cache hit is the longest run of leading blocks whose hashes are cached, but never the
  whole prompt: vLLM must compute at least one prompt token to produce logits, so the hit is capped
  at ``(num_tokens - 1) // block_size`` blocks.
* Hits and queries are counted **in tokens**: ``queries += num_prompt_tokens``,
  ``hits += hit_blocks * block_size``.
* The KV pool has ``num_blocks`` blocks. Blocks of running requests are pinned (reference count > 0).
  Freed blocks keep their cached content and join an LRU free queue; a request's blocks are freed
  tail-first, so a prompt's tail is evicted before its shared head. Allocation takes the least
  recently freed block and drops its old hash from the cache (eviction). A hit on a free cached
  block takes it back out of the free queue.
* KV usage is ``1 - free / total`` (cached-but-unreferenced blocks count as free, as in vLLM).

Costs: hashing O(tokens); lookup O(hit blocks); allocate/free O(blocks of the request).
``num_blocks=None`` gives an unbounded pool (the auditor's one-replica, infinite-cache projection).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

__all__ = ["NONE_HASH", "Allocation", "PrefixCache", "block_hashes", "hit_rate"]

NONE_HASH = 0x5F3759DF_2B992DDF  # seed of the first block when no cache salt is given


def _first_seed(salt: str | None) -> int:
    if not salt:
        return NONE_HASH
    return xxhash.xxh3_64_intdigest(salt.encode("utf-8"), seed=NONE_HASH)


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    salt: str | None = None,
    parent: int | None = None,
) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (a partial last block has none).

    ``parent`` continues a chain (the hash of the block before ``token_ids[0]``), which lets a
    caller hash generated tokens after the prompt without rehashing the prompt.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    n_full = len(token_ids) // block_size
    if n_full == 0:
        return []
    ids = token_ids if isinstance(token_ids, tuple) else tuple(token_ids)
    h = _first_seed(salt) if parent is None else parent
    out: list[int] = []
    append = out.append
    for off in range(0, n_full * block_size, block_size):
        h = hash((h, ids[off : off + block_size]))
        append(h)
    return out


def hit_rate(hits: int, queries: int) -> float:
    return hits / queries if queries else 0.0


@dataclass(eq=False)
class Allocation:
    """The KV blocks one request holds, in order. ``hit_tokens`` is what vLLM counts as a hit."""

    blocks: list[int]
    num_tokens: int
    hit_tokens: int
    cached_upto: int = 0  # leading blocks already registered in the cache
    freed: bool = field(default=False)


class PrefixCache:
    """vLLM's KV block pool with prefix caching (see the module docstring for the rules)."""

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
