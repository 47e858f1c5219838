"""Consistent-hash rings: key -> replicas in a stable preference order.

Two rings with one interface (`Ring`: ``members`` and ``walk(key)``) and one walk
(`base.distinct_owners`):

- ``"xxhash"``: `HashRing` (`router.ring.hashring`), ``vnodes`` points per unit of weight;
- ``"nginx"``: `NginxRing` (`router.ring.nginx`), nginx's own ``hash $key consistent;`` ring
  bit for bit, so a router and an nginx in front of the same servers agree.

Modules import only ``base`` (never this package), so there is no import cycle among them.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.ring.base import Ring, RingMember
from router.ring.hashring import HashRing
from router.ring.nginx import NginxRing

__all__ = ["RING_KINDS", "HashRing", "Ring", "RingMember", "build_ring"]

RING_KINDS = ("xxhash", "nginx")


def build_ring(kind: str, members: Sequence[RingMember], vnodes: int = 160) -> Ring:
    """``"xxhash"`` -> :class:`HashRing`; ``"nginx"`` -> :class:`NginxRing` (nginx's own ring
    has a fixed 160 points per weight, so ``vnodes`` does not apply)."""
    if kind == "xxhash":
        return HashRing(members, vnodes)
    if kind == "nginx":
        return NginxRing(members)
    raise ValueError(f"ring kind: expected one of {', '.join(RING_KINDS)}, got {kind!r}")
