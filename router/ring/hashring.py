"""The xxhash consistent-hash ring (``routing.ring: xxhash``, the default).

Algorithm: every member gets ``vnodes * weight`` points at ``xxh3_64(name + "\\0" + i)`` on a
64-bit circle; a key is hashed with ``xxh3_64`` and :meth:`HashRing.walk` yields the distinct
owners of the points clockwise from the key's position. The first owner is the key's *home*.

Invariants:
- Points depend only on member names and weights (not addresses, not input order), so every
  router worker and pod with the same membership builds the same ring.
- Adding or removing one of N equal-weight members moves about 1/N of the keys, and removal
  moves only the keys whose home was the removed member (everyone else's walk is unchanged
  except for skipping it).
- With 160 points per member the keys per member stay within a few tens of percent of the mean.

Cost: build O(P log P) for P = vnodes * total weight points; ``walk`` is O(log P) to find the
start, then about N * H(N) point steps to enumerate all N members (coupon collector,
`router.ring.base.distinct_owners`). The walk of the last 4096 keys is memoised (the ring is
immutable), so a hot prefix costs one dictionary lookup.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterator, Sequence

import xxhash

from router.ring.base import RingMember, distinct_owners

__all__ = ["ORDER_CACHE_SIZE", "HashRing"]

ORDER_CACHE_SIZE = 4096


class HashRing:
    """xxhash consistent-hashing ring with ``vnodes`` points per unit of weight."""

    def __init__(self, members: Sequence[RingMember], vnodes: int = 160) -> None:
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        ordered = tuple(sorted(members, key=lambda m: m.name))
        names = [m.name for m in ordered]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate ring member names: {names}")
        self.members: tuple[RingMember, ...] = ordered
        self.vnodes = vnodes
        points = sorted(
            (xxhash.xxh3_64_intdigest(f"{m.name}\0{i}".encode()), index)
            for index, m in enumerate(ordered)
            for i in range(vnodes * m.weight)
        )
        self._hashes = [h for h, _ in points]
        self._owners = [owner for _, owner in points]
        self._names = names
        # Hot prefixes repeat: remember their full walks (the ring is immutable).
        self._order = functools.lru_cache(maxsize=ORDER_CACHE_SIZE)(self._compute_order)

    def walk(self, key: str) -> Iterator[str]:
        return iter(self._order(key))

    def _compute_order(self, key: str) -> tuple[str, ...]:
        if not self._hashes:
            return ()
        start = bisect.bisect_left(
            self._hashes, xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogatepass"))
        )
        return tuple(distinct_owners(self._owners, self._names, start))

    def home(self, key: str) -> str | None:
        return next(self.walk(key), None)

    def __repr__(self) -> str:
        return f"HashRing({len(self.members)} members, {len(self._hashes)} points)"
