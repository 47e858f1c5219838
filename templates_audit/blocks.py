"""vLLM's prefix-cache block arithmetic — the project's single implementation.

The simulated replica (``loadtest.replica``) and the auditor (``templates_audit.analysis``) both use
this module, so a hit the auditor projects is exactly a hit the simulator serves.

What vLLM (V1 engine, ``--enable-prefix-caching``) does, and what this module reproduces:

* A prompt's token ids are cut into blocks of ``block_size`` tokens. Only **full** blocks are hashed
  and cached; a partial last block is never reused.
* Block hashes are **chained**: block *i*'s hash covers its own tokens and block *i-1*'s hash, so
  the same 16 tokens after a different prefix hash differently (a miss). Here the chain is
  ``h_i = hash((h_{i-1}, hash(tokens_i)))`` — CPython's tuple hash over ints, which is
  deterministic across processes (ints are not randomised by PYTHONHASHSEED) and about twice as
  fast as packing the ids for xxh3 — with the first seed derived from an optional cache salt
  (vLLM's ``cache_salt``). The tokens' own hash is a separate step so that a caller re-chaining
  known blocks after a new parent (the auditor's reference prompt after a changed value) hashes
  each block's tokens once, not once per chain (:func:`chain_token_hashes`). vLLM uses sha256
  (or its builtin-hash option, the same idea as here); the hash function differs, the equality
  relation between blocks is the same.
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

Costs: hashing O(tokens); lookup O(hit blocks); allocate/free O(blocks of the request), done
with batch operations on dicts (``map``/``dict.update`` loops run in C, not one Python step per
block). :meth:`PrefixCache.insert` with nothing pinned (a sequential replay, as the auditor's)
skips the reference counts altogether.
``num_blocks=None`` gives an unbounded pool (the auditor's one-replica, infinite-cache projection).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import compress, filterfalse, islice, repeat
from operator import is_
from typing import cast

import xxhash

__all__ = ["NONE_HASH", "Allocation", "PrefixCache", "block_hashes", "block_token_hashes",
           "chain_token_hashes", "hit_rate"]

NONE_HASH = 0x5F3759DF_2B992DDF  # seed of the first block when no cache salt is given
_SMALL = 8  # blocks: fewer are handled by plain loops, more by batch operations


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
    n = len(token_ids)
    if n < block_size:
        return []
    h = _first_seed(salt) if parent is None else parent
    if n >= _SMALL * block_size:
        return chain_token_hashes(block_token_hashes(token_ids, block_size), h)
    # A few blocks (a request's tail after a cached head): one loop costs less than setting up
    # the iterator pipeline. The same tuples are hashed, so the same hashes.
    out: list[int] = []
    for i in range(0, n - n % block_size, block_size):
        h = hash((h, hash(tuple(token_ids[i:i + block_size]))))
        out.append(h)
    return out


def block_token_hashes(token_ids: Iterable[int], block_size: int) -> Iterator[int]:
    """``hash`` of each full block's tuple of ids, the input of :func:`chain_token_hashes`."""
    # zip over block_size references to one iterator yields the full blocks as tuples (in C);
    # a partial last block is dropped.
    it = iter(token_ids)
    return map(hash, zip(*([it] * block_size), strict=False))


def chain_token_hashes(token_hashes: Iterable[int], parent: int) -> list[int]:
    """The chain step of :func:`block_hashes` over the blocks' token hashes (``hash`` of each
    block's tuple of ids): ``parent`` is the hash of the block before the first (``NONE_HASH``
    or the salted seed for a new chain). A caller that keeps the token hashes of a prompt's
    blocks (a reference prompt's) re-chains them after a new parent without rehashing tokens."""
    h = parent
    out: list[int] = []
    append = out.append
    for th in token_hashes:
        h = hash((h, th))
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


_SCAN = 16  # blocks looked up per C pass when the hit search expects a miss


def _drain(it: Iterable[object]) -> None:
    """Run an iterator of calls to completion in C (``deque(..., maxlen=0)``)."""
    deque(it, maxlen=0)


class PrefixCache:
    """vLLM's KV block pool with prefix caching (see the module docstring for the rules).

    State: ``_cached`` (hash -> block) and ``_hash`` (block -> hash or None) are one bijection over
    the cached blocks; ``_ref`` holds the reference count of every pinned block (absent: 0) and
    ``_multi`` how many of them are pinned more than once; a bounded pool keeps every unpinned
    block in the ``_free`` queue (eviction order, head first), an unbounded one recycles uncached
    unpinned blocks from ``_spare``.

    Per-block work runs as C loops (``map`` over dict/list methods drained by a zero-length
    deque, ``dict.update``) rather than one Python step per block. :meth:`insert` with nothing
    pinned — a sequential replay, as the auditor's — also skips the reference counts and keeps
    every block in the free queue, reordering it with ``move_to_end`` (much cheaper in CPython's
    ``OrderedDict`` than removing and re-adding keys); the resulting state is the one
    ``allocate`` + ``cache_full_blocks`` + ``free`` produce (a test replays random traces both
    ways).
    """

    def __init__(self, num_blocks: int | None, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        if num_blocks is not None and num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0 or None, got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._ref: dict[int, int] = {}
        self._multi = 0
        self._hash: list[int | None] = []
        self._cached: dict[int, int] = {}  # block hash -> block id
        # Free blocks in eviction order (head evicted first). Never-used blocks come first.
        self._free: OrderedDict[int, None] = OrderedDict()
        self._spare: list[int] = []  # unbounded pool only: uncached blocks to recycle
        if num_blocks is not None:
            self._hash = [None] * num_blocks
            self._free = OrderedDict.fromkeys(range(num_blocks))
        # Told the hashes that leave the cache by eviction and the hashes that enter it, in
        # order (None: nobody listens): the simulated replica's KV-event journal. A hash that is
        # already cached (kept in its first block) is not told again.
        self.on_evict: Callable[[list[int]], None] | None = None
        self.on_store: Callable[[list[int]], None] | None = None
        self.hits = 0  # tokens, as vLLM's prefix_cache_hits counter
        self.queries = 0  # tokens, as vLLM's prefix_cache_queries counter
        self.evictions = 0

    # -- queries -----------------------------------------------------------------------------
    def _hit_blocks(self, hashes: Sequence[int], num_tokens: int,
                    max_blocks: int | None = None) -> list[int]:
        limit = min(len(hashes), max(num_tokens - 1, 0) // self.block_size)
        if max_blocks is not None:
            limit = min(limit, max_blocks)
        if limit <= 0:
            return []
        get = self._cached.get
        # The last block is cached, so most likely all are; or only the last one is new (a new
        # user turn after a cached prefix): then look them up in one C pass.
        if get(hashes[limit - 1]) is not None:
            upto = limit
        elif limit >= 2 and get(hashes[limit - 2]) is not None:
            upto = limit - 1
        else:
            upto = 0
        if upto:
            found = list(map(get, islice(hashes, upto)))
            if None in found:
                del found[found.index(None):]
            return found  # type: ignore[return-value]  # the Nones are cut off
        # The hit ends earlier: look up a chunk at a time (each chunk one C pass) until a chunk
        # holds the first miss.
        out: list[int | None] = []
        for start in range(0, limit, _SCAN):
            found = list(map(get, hashes[start:min(start + _SCAN, limit)]))
            if None in found:
                out += found[:found.index(None)]
                break
            out += found
        return out  # type: ignore[return-value]  # no None in it

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
    def _evict(self, taken: list[int]) -> None:
        """Drop the cached content of ``taken`` (blocks about to hold new tokens)."""
        hashd = self._hash
        olds = list(map(hashd.__getitem__, taken))
        evicted = len(olds) - olds.count(None)
        if evicted:
            self.evictions += evicted
            # pop(None, None) is a no-op for the blocks that held nothing.
            _drain(map(self._cached.pop, cast("list[int]", olds), repeat(None)))
            _drain(map(hashd.__setitem__, taken, repeat(None)))
            if self.on_evict is not None:
                self.on_evict([h for h in olds if h is not None])

    def _new_blocks(self, need: int) -> list[int]:
        """Unbounded pool: ``need`` uncached blocks, recycled (last freed first) or new."""
        spare = self._spare
        k = min(need, len(spare))
        taken: list[int] = []
        if k:
            cut = len(spare) - k
            taken = spare[cut:]
            taken.reverse()  # popped from the end, one at a time
            del spare[cut:]
        if need > k:
            first = len(self._hash)
            self._hash.extend([None] * (need - k))
            taken.extend(range(first, first + need - k))
        return taken

    def _take(self, need: int) -> list[int]:
        """``need`` blocks for new content, out of the free queue's head (the caller checked
        that there are enough), their old hashes evicted; pinned by the caller."""
        if self.num_blocks is None:  # unbounded: never evict, recycle uncached blocks
            return self._new_blocks(need)
        free = self._free
        taken = list(islice(free, need))
        _drain(map(free.__delitem__, taken))
        self._evict(taken)
        return taken

    def allocate(self, hashes: Sequence[int], num_tokens: int, record: bool = True) -> Allocation | None:
        """Pin the cached prefix and allocate blocks for the rest of the prompt.

        Returns None (and changes nothing) when the pool cannot hold the request. ``record``
        counts the request in ``hits``/``queries`` (vLLM records once per scheduled request).
        """
        hit = self._hit_blocks(hashes, num_tokens)
        nhit = len(hit)
        need = self.blocks_for(num_tokens) - nhit
        ref = self._ref
        bounded = self.num_blocks is not None
        pins = dict.fromkeys(hit, 1)
        # No hit block pinned yet and none twice: pin them all at once.
        fast = len(pins) == nhit and ref.keys().isdisjoint(pins)
        if bounded:
            # Pinning a free hit block takes it out of the free queue: it is not spare.
            hit_free = nhit if fast else sum(1 for b in hit if b not in ref)
            if need > len(self._free) - hit_free:
                return None
        if fast:
            if bounded:
                _drain(map(self._free.__delitem__, hit))
            ref.update(pins)
        else:
            for b in hit:
                c = ref.get(b, 0)
                if c == 0:
                    if bounded:
                        self._free.pop(b, None)
                elif c == 1:
                    self._multi += 1
                ref[b] = c + 1
        blocks = hit
        if need > 0:
            taken = self._take(need)
            ref.update(dict.fromkeys(taken, 1))
            blocks = hit + taken
        hit_tokens = nhit * self.block_size
        if record:
            self.queries += num_tokens
            self.hits += hit_tokens
        return Allocation(blocks=blocks, num_tokens=num_tokens, hit_tokens=hit_tokens,
                          cached_upto=nhit)

    def extend(self, alloc: Allocation, num_tokens: int) -> bool:
        """Grow ``alloc`` to hold ``num_tokens`` (decode). False when the pool is exhausted."""
        need = self.blocks_for(num_tokens) - len(alloc.blocks)
        if need > 0:
            if self.num_blocks is not None and need > len(self._free):
                return False
            taken = self._take(need)
            self._ref.update(dict.fromkeys(taken, 1))
            alloc.blocks.extend(taken)
        alloc.num_tokens = max(alloc.num_tokens, num_tokens)
        return True

    def _register(self, hashes: Sequence[int], blocks: Sequence[int]) -> None:
        """Cache ``blocks[i]`` under ``hashes[i]`` unless the hash is already cached (vLLM keeps
        the first identical block). The blocks hold no hash: past an allocation's ``cached_upto``
        every block came out of :meth:`_take` uncached, and nothing caches it but its owner."""
        # setdefault keeps the first block of a hash (cached before, or earlier in this
        # request); a block is registered iff setdefault returned it.
        kept = list(map(self._cached.setdefault, hashes, blocks))
        hashd = self._hash
        if kept == blocks:
            _drain(map(hashd.__setitem__, blocks, hashes))
            if self.on_store is not None:
                self.on_store(list(hashes))
            return
        for h, bid, first in zip(hashes, blocks, kept, strict=True):
            if first == bid:
                hashd[bid] = h
        if self.on_store is not None:
            self.on_store([h for h, bid, first in zip(hashes, blocks, kept, strict=True)
                           if first == bid])

    def cache_full_blocks(self, alloc: Allocation, hashes: Sequence[int]) -> None:
        """Register the computed full blocks of ``alloc`` (prompt and generated) for reuse."""
        start = alloc.cached_upto
        upto = min(len(hashes), len(alloc.blocks))
        if upto > start:
            self._register(hashes[start:upto], alloc.blocks[start:upto])
            alloc.cached_upto = upto

    def free(self, alloc: Allocation) -> None:
        """Release ``alloc``; its cached blocks stay reusable until evicted (tail first)."""
        if alloc.freed:
            return
        alloc.freed = True
        ref = self._ref
        bounded = self.num_blocks is not None
        if not self._multi:  # every pinned block is pinned once: all of these become free
            blocks = alloc.blocks
            _drain(map(ref.__delitem__, blocks))
            if bounded:
                self._free.update(zip(reversed(blocks), repeat(None)))
            else:
                self._recycle(blocks)
            return
        for bid in reversed(alloc.blocks):
            c = ref[bid]
            if c > 1:
                ref[bid] = c - 1
                if c == 2:
                    self._multi -= 1
                continue
            del ref[bid]
            if bounded:
                self._free[bid] = None
            elif self._hash[bid] is None:
                self._spare.append(bid)

    def reset(self) -> bool:
        """Forget every cached block (vLLM's ``reset_prefix_cache``): no later request hits.

        Refused (False, nothing changed) while a request pins blocks, as vLLM refuses while
        blocks are held. The free queue keeps its order; ``evictions`` does not count the reset.
        """
        if self._ref:
            return False
        self._cached.clear()
        n = len(self._hash)
        self._hash = [None] * n
        if self.num_blocks is None:
            self._spare = list(range(n))
        return True

    def next_evictions(self, n: int) -> list[int | None]:
        """The hashes of the next ``n`` blocks an allocation with no cache hit would take, head
        of the free queue first (None: a free block that caches nothing; a hit takes its own
        blocks out of the queue first; an unbounded pool evicts nothing: []). O(n)."""
        return [self._hash[b] for b in islice(self._free, max(n, 0))]

    def cached_hashes(self) -> list[int]:
        """The hashes of every cached block, in no particular order (for checks and tests)."""
        return list(self._cached)

    def _recycle(self, blocks: list[int]) -> None:
        """Unbounded pool: the uncached ones of freed ``blocks`` become spare, tail first."""
        rev = blocks[::-1]
        self._spare.extend(compress(rev, map(is_, map(self._hash.__getitem__, rev), repeat(None))))

    def insert(self, hashes: Sequence[int], num_tokens: int, record: bool = True,
               hit_limit: int | None = None) -> int:
        """Serve one request start to finish (allocate, cache its full blocks, free); its hit tokens.

        The auditor's projection of one replica is a loop over this call in trace order.
        ``hit_limit`` caps the hit at that many leading blocks, as vLLM does when the full blocks
        of a request include generated tokens (its prompt's last token is never a hit): the same
        as ``allocate(hashes[:hit_limit], ...)``, ``cache_full_blocks(alloc, hashes)``, ``free``.
        """
        if self._ref:  # requests are running: the general path
            return self._insert_pinned(hashes, num_tokens, record, hit_limit)
        bs = self.block_size
        cached = self._cached
        if num_tokens > bs and hashes and hashes[0] in cached and hit_limit != 0:
            if num_tokens <= _SMALL * bs:  # a few blocks (the auditor's lazy tails): a plain loop
                limit = min(len(hashes), (num_tokens - 1) // bs)
                if hit_limit is not None and hit_limit < limit:
                    limit = hit_limit
                hit = []
                for i in range(limit):
                    bid = cached.get(hashes[i])
                    if bid is None:
                        break
                    hit.append(bid)
            else:
                hit = self._hit_blocks(hashes, num_tokens, hit_limit)
            nhit = len(hit)
            if nhit > 1 and len(set(hit)) != nhit:  # one block twice (equal hashes): the general path
                return self._insert_pinned(hashes, num_tokens, record, hit_limit)
        else:
            hit, nhit = [], 0
        need = -(-num_tokens // bs) - nhit
        if self.num_blocks is None:
            # Unbounded: hit blocks stay cached and unqueued; new blocks are cached, and the
            # ones left uncached become spare again.
            if need > 0:
                taken = self._new_blocks(need)
                upto = min(len(hashes), nhit + need)
                if upto > nhit:
                    self._register(hashes[nhit:upto], taken[:upto - nhit])
                self._recycle(taken)
            if record:
                self.queries += num_tokens
                self.hits += nhit * bs
            return nhit * bs
        free = self._free
        if need > len(free) - nhit:
            return 0
        if need > 0:
            # The head of the free queue, hit blocks excluded (they are pinned first).
            if nhit:
                excluded = hit.__contains__ if nhit <= _SMALL else set(hit).__contains__
                taken = list(islice(filterfalse(excluded, free), need))
            else:
                taken = list(islice(free, need))
            hashd = self._hash
            upto = min(len(hashes), nhit + need)
            if need <= _SMALL:
                gone: list[int] = []
                for bid in taken:
                    old = hashd[bid]
                    if old is not None:
                        self.evictions += 1
                        del cached[old]
                        hashd[bid] = None
                        gone.append(old)
                if gone and self.on_evict is not None:
                    self.on_evict(gone)
                new: list[int] = []
                for i in range(nhit, upto):
                    h = hashes[i]
                    if h not in cached:
                        bid = taken[i - nhit]
                        cached[h] = bid
                        hashd[bid] = h
                        new.append(h)
                if new and self.on_store is not None:
                    self.on_store(new)
                move = free.move_to_end
                for bid in reversed(taken):
                    move(bid)
            else:
                self._refill(taken, hashes[nhit:upto])
                # Freed tail first: the blocks end up at the queue's tail in reverse order.
                _drain(map(free.move_to_end, reversed(taken)))
        if nhit > _SMALL:
            _drain(map(free.move_to_end, reversed(hit)))
        elif nhit:
            move = free.move_to_end
            for bid in reversed(hit):
                move(bid)
        hit_tokens = nhit * bs
        if record:
            self.queries += num_tokens
            self.hits += hit_tokens
        return hit_tokens

    def _refill(self, taken: list[int], hashes: Sequence[int]) -> None:
        """``_evict(taken)`` then ``_register(hashes, taken[:len(hashes)])``, in fewer passes: a
        block that gets a new hash is not reset to None first."""
        cached, hashd = self._cached, self._hash
        olds = list(map(hashd.__getitem__, taken))
        evicted = len(olds) - olds.count(None)
        if evicted:
            self.evictions += evicted
            _drain(map(cached.pop, cast("list[int]", olds), repeat(None)))
            if self.on_evict is not None:
                self.on_evict([h for h in olds if h is not None])
        m = len(hashes)
        blocks = taken[:m]
        kept = list(map(cached.setdefault, hashes, blocks))
        if kept == blocks:
            _drain(map(hashd.__setitem__, blocks, hashes))
            if self.on_store is not None:
                self.on_store(list(hashes))
        else:  # some hashes were already cached or repeated: their blocks stay empty
            for h, bid, first in zip(hashes, blocks, kept, strict=True):
                hashd[bid] = h if first == bid else None
            if self.on_store is not None:
                self.on_store([h for h, bid, first in zip(hashes, blocks, kept, strict=True)
                               if first == bid])
        if len(taken) > m:
            _drain(map(hashd.__setitem__, taken[m:], repeat(None)))

    def _insert_pinned(self, hashes: Sequence[int], num_tokens: int, record: bool,
                       hit_limit: int | None = None) -> int:
        alloc = self.allocate(hashes if hit_limit is None else hashes[:hit_limit], num_tokens,
                              record=record)
        if alloc is None:
            return 0
        self.cache_full_blocks(alloc, hashes)
        self.free(alloc)
        return alloc.hit_tokens
