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

When are head blocks provably cached? In an unbounded pool (``num_blocks=None``), once inserted,
forever: the shortcut is **exact** (a unit test replays random traces both ways).

In a bounded LRU pool the shortcut is an approximation, used only with ``exact=False``: a head is
trusted for ``num_blocks // 4`` block allocations after a request that inserted it in full (a
block freed at the most-recently-used end survives at least ``num_blocks - B`` allocations from
the free queue, B = blocks of one request), and the next request of that head after the window pays the full insert, which
refreshes it. What it gets wrong: vLLM touches a head's blocks on *every* use, the shortcut only
at refresh, so a head that is used, goes idle and is evicted can be evicted up to one window
earlier than in vLLM. With a busy template (the case the shortcut is for) the head never ages
out and the two agree; docs/auditor.md gives the measured difference.

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
    refreshed_at: int = -1  # Replay.allocated at the last full insert; -1 = never
    fresh_blocks: int = 0  # how many leading head blocks that insert covered


class Replay:
    def __init__(self, cache: PrefixCache, *, exact: bool = False) -> None:
        self.cache = cache
        self.hits = 0
        self.queries = 0
        self.allocated = 0  # blocks taken from the free queue (evicting or not)
        self._window = None if cache.num_blocks is None else cache.num_blocks // 4
        # A bounded pool is replayed block by block when exactness is asked for.
        self._lazy = cache.num_blocks is None or not exact

    def serve(self, head: Head, shared: int, tail: list[int], num_tokens: int) -> int:
        """Serve a request whose hashes are ``head.hashes[:shared] + tail``; its hit tokens."""
        cache = self.cache
        bs = cache.block_size
        capped = (num_tokens - 1) // bs if num_tokens > 0 else 0
        if capped < shared:
            tail = head.hashes[capped:shared] + tail
            shared = capped
        # Are the head's first `shared` blocks still provably cached (see the module docstring)?
        # Written out here rather than in a helper: this runs twice per audited request.
        window = self._window
        if (shared and self._lazy and 0 <= head.refreshed_at and shared <= head.fresh_blocks
                and (window is None or self.allocated - head.refreshed_at < window)):
            hit = shared * bs + cache.insert(tail, num_tokens - shared * bs, record=False)
        else:
            hit = cache.insert(head.hashes[:shared] + tail, num_tokens, record=False)
            head.refreshed_at = self.allocated
            head.fresh_blocks = shared
        self.allocated += -(-num_tokens // bs) - hit // bs
        self.hits += hit
        self.queries += num_tokens
        return hit
