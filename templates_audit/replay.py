"""Replay requests through one :class:`~templates_audit.blocks.PrefixCache`, in trace order,
without redoing per-block work for a template's shared head on every request.

A request's block hashes are ``head.hashes[:shared] + tail``: the first ``shared`` blocks are
its template's reference blocks (the *head*), the rest its own. Serving it with
``PrefixCache.insert`` costs O(all blocks) — ~180 dict operations for a 2k-token prompt, twice
per request (observed and achievable). When the head blocks are provably cached, the same result
comes from serving only the tail: the cache's lookup walks successive hashes, so a request whose
first ``shared`` blocks are cached hits ``shared`` blocks plus whatever its tail hits, and the
"at least one token is recomputed" cap shifts by exactly ``shared`` blocks. So
``insert(tail, num_tokens - shared * block_size)`` plus ``shared`` blocks equals
``insert(all hashes, num_tokens)`` — the block math stays in ``blocks.py``.

When are head blocks provably cached? In an unbounded pool, once inserted, forever. In a bounded
LRU pool a block freed at the most-recently-used end survives at least ``num_blocks - B``
evictions (B = blocks of one request); a head is therefore trusted only for
``num_blocks // 4`` evictions after a request that inserted it in full, and the next request of
that template after the window pays the full insert, which refreshes it. Skipping the head's
LRU touches in between only changes the relative age of head blocks, which stay inside the window.

Cost per request: O(tail blocks) in the common case, O(all blocks) once per window per template.
"""

from __future__ import annotations

from dataclasses import dataclass

from templates_audit.blocks import PrefixCache

__all__ = ["Head", "Replay"]


@dataclass(eq=False)
class Head:
    """A template's reference block hashes and when they were last inserted in full."""

    hashes: list[int]
    refreshed_at: int = -1  # cache.evictions at the last full insert; -1 = never
    fresh_blocks: int = 0  # how many leading head blocks that insert covered


class Replay:
    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache
        self.hits = 0
        self.queries = 0
        self._window = None if cache.num_blocks is None else cache.num_blocks // 4

    def _fresh(self, head: Head, shared: int) -> bool:
        if head.refreshed_at < 0 or shared > head.fresh_blocks:
            return False
        return self._window is None or self.cache.evictions - head.refreshed_at < self._window

    def serve(self, head: Head, shared: int, tail: list[int], num_tokens: int) -> int:
        """Serve a request whose hashes are ``head.hashes[:shared] + tail``; its hit tokens."""
        cache = self.cache
        bs = cache.block_size
        capped = min(shared, max(num_tokens - 1, 0) // bs)
        if capped < shared:
            tail = head.hashes[capped:shared] + tail
            shared = capped
        if shared and self._fresh(head, shared):
            hit = shared * bs + cache.insert(tail, num_tokens - shared * bs, record=False)
        else:
            hit = cache.insert(head.hashes[:shared] + tail, num_tokens, record=False)
            head.refreshed_at = cache.evictions
            head.fresh_blocks = shared
        self.hits += hit
        self.queries += num_tokens
        return hit
