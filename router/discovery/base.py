"""Discovery contract: `Endpoint`, the `Discovery` protocol, and the helpers every source shares.

A discovery source runs until cancelled and calls `publish` with the FULL current membership
(never a delta) once at start and again whenever it changes. Invariants the router relies on:

* `Endpoint.name` is the replica identity the hash ring is built from. It must be stable across
  restarts of the same replica (a StatefulSet pod name, a reverse-DNS name) so that several router
  pods with the same membership route identically with no shared state.
* Names are unique within one published list; lists are sorted by name, so two sources that see the
  same membership publish equal lists.
* `ready=False`: the replica gets no traffic. `terminating=True`: the replica is draining (no new
  requests; in-flight ones finish). Both stay in the membership until the source drops them.

`Membership` de-duplicates publishes (an unchanged list is not re-published) and logs each change
once as a diff. `Backoff` is capped exponential backoff with jitter. Both are O(n) per update.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from router.roles import DEFAULT_ROLE, Role

__all__ = ["Backoff", "Discovery", "Endpoint", "Membership", "Publish", "url_for"]

log = logging.getLogger("router.discovery")


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str
    weight: int = 1
    ready: bool = True
    terminating: bool = False
    models: tuple[str, ...] | None = None  # served names, when the source knows them
    role: Role = DEFAULT_ROLE  # prefill | decode | both (router.roles)

    @property
    def state(self) -> str:
        if self.terminating:
            return "terminating"
        return "ready" if self.ready else "not-ready"


Publish = Callable[[list[Endpoint]], None]


class Discovery(Protocol):
    async def run(self, publish: Publish) -> None:
        """Run until cancelled; publish the full membership at start and on every change."""
        ...


def url_for(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


class Membership:
    """Publishes a membership only when it differs from the last one, logging the diff."""

    def __init__(self, publish: Publish, source: str) -> None:
        self._publish = publish
        self._source = source
        self._last: dict[str, Endpoint] | None = None

    @property
    def published(self) -> bool:
        return self._last is not None

    def update(self, endpoints: Iterable[Endpoint]) -> bool:
        current = {e.name: e for e in sorted(endpoints, key=lambda e: e.name)}
        if current == self._last:
            return False
        self._log_diff(self._last or {}, current)
        self._last = current
        self._publish(list(current.values()))
        return True

    def _log_diff(self, old: dict[str, Endpoint], new: dict[str, Endpoint]) -> None:
        changes = [f"+{n} ({e.state}, {e.url})" for n, e in new.items() if n not in old]
        changes += [f"-{n}" for n in old if n not in new]
        changes += [f"~{n} {old[n].state}->{e.state}" if old[n].state != e.state
                    else f"~{n} role {old[n].role}->{e.role}" if old[n].role != e.role
                    else f"~{n} {old[n].url}->{e.url}"
                    for n, e in new.items() if n in old and old[n] != e]
        log.info("%s discovery: %d endpoints (%d ready): %s", self._source, len(new),
                 sum(e.ready and not e.terminating for e in new.values()),
                 ", ".join(changes) or "no endpoints")


class Backoff:
    """Capped exponential backoff with "equal jitter": each delay is in [d/2, d], d = base*2^n."""

    def __init__(self, base: float = 0.25, cap: float = 30.0,
                 rng: Callable[[], float] = random.random) -> None:
        self.base = base
        self.cap = cap
        self._rng = rng
        self.failures = 0

    def next(self) -> float:
        d = min(self.cap, self.base * (2 ** min(self.failures, 30)))
        self.failures += 1
        return d / 2 + self._rng() * d / 2

    def reset(self) -> None:
        self.failures = 0
