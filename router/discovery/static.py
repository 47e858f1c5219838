"""Static discovery: a fixed membership from `router.yaml` (`replicas:`), published once.

Cost: O(n log n) once; then the task sleeps until cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from router.discovery.base import Endpoint, Membership, Publish

__all__ = ["StaticDiscovery"]


class StaticDiscovery:
    def __init__(self, endpoints: Iterable[Endpoint]) -> None:
        self.endpoints = list(endpoints)
        names = [e.name for e in self.endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate endpoint names: {sorted(names)}")

    async def run(self, publish: Publish) -> None:
        Membership(publish, "static").update(self.endpoints)
        await asyncio.Event().wait()
