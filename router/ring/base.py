"""What every ring shares: its members, the `Ring` protocol, and the walk along its points.

A ring here is a sorted circle of points, each owned by one member (``owners[i]`` indexes
``names``). Walking from a point visits points clockwise and yields each owner the first time it
is met, so a walk lists every member exactly once, in the key's preference order.

Cost of `distinct_owners`: about N * H(N) point steps for N members when every member has many
points (coupon collector), O(P) at worst for P points; lazy, so a caller that stops at the first
usable member pays only for the points it stepped over.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Ring", "RingMember", "distinct_owners"]


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


def distinct_owners(owners: Sequence[int], names: Sequence[str], start: int) -> Iterator[str]:
    """``names[owners[i]]`` for i = start, start+1, ... (wrapping), each name once; stops once
    every name was yielded or the circle was walked once. ``owners`` empty: nothing."""
    total = len(owners)
    remaining = len(names)
    seen = [False] * remaining
    for step in range(total):
        owner = owners[(start + step) % total]
        if not seen[owner]:
            seen[owner] = True
            yield names[owner]
            remaining -= 1
            if remaining == 0:
                return
