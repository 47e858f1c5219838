"""Consistent-hash ring: key -> replicas in a stable preference order.

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
start, then about N * H(N) point steps to enumerate all N members (coupon collector). The
walk of the last 4096 keys is memoised (the ring is immutable), so a hot prefix costs one
dictionary lookup.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import xxhash

__all__ = ["RING_KINDS", "HashRing", "Ring", "RingMember", "build_ring"]

RING_KINDS = ("xxhash", "nginx")
ORDER_CACHE_SIZE = 4096


@dataclass(frozen=True)
class RingMember:
    name: str
    weight: int = 1
    address: str = ""  # "host:port": what nginx's ring hashes

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("ring member: empty name")
        if self.weight < 1:
            raise ValueError(f"ring member {self.name!r}: weight must be >= 1, got {self.weight}")


class Ring(Protocol):
    members: tuple[RingMember, ...]

    def walk(self, key: str) -> Iterator[str]:
        """Distinct member names in ring order, starting at the key's home."""
        ...


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
        total = len(self._hashes)
        if total == 0:
            return ()
        start = bisect.bisect_left(
            self._hashes, xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogatepass"))
        )
        remaining = len(self._names)
        seen = [False] * remaining
        order: list[str] = []
        for step in range(total):
            owner = self._owners[(start + step) % total]
            if not seen[owner]:
                seen[owner] = True
                order.append(self._names[owner])
                remaining -= 1
                if remaining == 0:
                    break
        return tuple(order)

    def home(self, key: str) -> str | None:
        return next(self.walk(key), None)

    def __repr__(self) -> str:
        return f"HashRing({len(self.members)} members, {len(self._hashes)} points)"


def build_ring(kind: str, members: Sequence[RingMember], vnodes: int = 160) -> Ring:
    """``"xxhash"`` -> :class:`HashRing`; ``"nginx"`` -> ``router.ring_nginx.NginxRing``
    (nginx's own ring has a fixed 160 points per weight, so ``vnodes`` does not apply)."""
    if kind == "xxhash":
        return HashRing(members, vnodes)
    if kind == "nginx":
        from router.ring_nginx import NginxRing

        return NginxRing(members)
    raise ValueError(f"ring kind: expected one of {', '.join(RING_KINDS)}, got {kind!r}")
