"""Routing policies: (key, replica states, ring, seq) -> Decision. Pure: no I/O, no clock.

``prefix`` - consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018):

- Only available (healthy, not draining) replicas take part. With total load L over them and
  total weight W, replica i's cap is ``ceil(c * (L + 1) * w_i / W)`` - ``c`` times its share of
  the average *including the request being placed*; with equal weights ``ceil(c * (L+1) / n)``
  - but never below ``load_floor`` (the router's default is 8). vLLM batches (up to
  ``--max-num-seqs``, 256 by default): a replica with a handful of requests in flight is not
  congested, and spilling there trades a cold prefill of the whole shared prefix for nothing.
  The floor only matters at low load (at an average of 8 in flight over 4 replicas the cap is
  already 11). Measured with ``prefix-loadtest simulate`` on the bench setup (360 requests,
  12 req/s, 4 replicas): fleet hit rate 0.87/0.87/0.78 with no floor, 0.94/0.92/0.92 with 4,
  0.96/0.95/0.95 with 8 (shared-prefix / hot-prefix / multi-turn); at 40 req/s shared-prefix
  TTFT p99 1.40 s without a floor, 0.68 s with 4 or 8. The price is a less even request count
  per replica at low load, where it costs no latency.
  A replica is *under cap* while ``load < cap``, i.e. it can take this request without
  exceeding its cap.
- The key's *home* is the first available replica of the ring walk from the routing key (the
  prefix hash, else the conversation identity). Home under cap -> home (branch ``home``;
  ``override`` for an ``X-Prefix-Hash`` key, ``conversation`` for a conversation key).
- Otherwise the request **spills**, conversation-stably: a prefix key whose conversation is
  *sticky* (an explicit session/user identity, or a chat body that already carries history)
  ranks the next ``spill_width`` replicas of the walk by rendezvous hash of
  (conversation, replica), then the rest of the walk in ring order, and takes the first one
  under cap. So one conversation of a hot prefix keeps landing on the same replica turn after
  turn, while different conversations spread over a few replicas (which then all cache the
  hot prefix). A request with no state to follow (a first turn without identity, a one-shot
  request) uses the walk order itself: the prefix's overflow then lands on as few replicas as
  possible, so fewer replicas pay the cold prefill of the shared prefix (measured with
  ``prefix-loadtest simulate``: +10 points of fleet hit rate on shared-prefix against
  rendezvous for every request, see docs/router.md). Branch ``spill``.
  A conversation moves only if its preferred replica is at cap when its next turn arrives; in
  a cold burst caps start tiny, so a few early spills land on a second choice and move once
  (3 of 200 in the test's burst), after which they stay put.
- Nobody under cap -> least load/weight, ties in ring order (branch ``fallback``). With
  ``c >= 1`` the caps sum to at least ``c * (L + 1) > L``, so some replica is always under cap
  and this branch is a guard, not a path: it keeps the policy total should the cap rule change.
- Key with neither prefix nor conversation -> least loaded, ties by name (``least_loaded``).

Invariant: whenever some available replica is under cap, the chosen one is under cap, so no
replica ever exceeds ``ceil(c * average)`` through this policy's choices.

``candidates`` is the retry order: the chosen replica, then every other available replica in
ring order from the key's home (for ``round_robin``: the rotation order; ``least_loaded``: the
load order).

When to use which: ``prefix`` whenever requests share long prompt prefixes (system prompts,
tools, multi-turn chats) - it trades a bounded amount of imbalance (``c``) for cache hits;
``least_loaded`` and ``round_robin`` are baselines for comparison runs, or for fleets with
prefix caching off.

Cost: O(N) to read loads plus the ring walk (memoised per key by ``HashRing``); N is the
fleet size. No allocation beyond the candidates tuple and two small dicts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, Protocol

import xxhash

from router.keys import KeySource, RoutingKey
from router.replicas import ReplicaState
from router.ring import Ring

__all__ = [
    "POLICIES",
    "BoundedLoadPrefixPolicy",
    "Branch",
    "Decision",
    "LeastLoadedPolicy",
    "LoadBound",
    "Policy",
    "RoundRobinPolicy",
    "load_cap",
    "make_policy",
    "moved_decision",
]

POLICIES = ("prefix", "cache_aware", "round_robin", "least_loaded")
SPILL_WIDTH = 3  # replicas a sticky conversation's spill is ranked over (rendezvous)


class Branch(StrEnum):
    HOME = "home"
    SPILL = "spill"
    OVERRIDE = "override"
    CONVERSATION = "conversation"
    FALLBACK = "fallback"
    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"
    CACHE_HIT = "cache_hit"
    LORA_AFFINITY = "lora_affinity"  # router.models.lora_affinity moved it to its adapter
    DECODE_LOAD = "decode_load"  # a disaggregated request's decode instance, chosen by load


class Decision(NamedTuple):  # per request: half of a frozen dataclass's cost
    replica: str
    branch: Branch
    candidates: tuple[str, ...]  # candidates[0] == replica; then the retry order
    home: str | None = None  # the key's home replica (differs from replica on spill/fallback)
    predicted: int = 0  # prompt tokens the prefix index predicts the replica has cached


class Policy(Protocol):
    name: str

    def choose(
        self, key: RoutingKey, replicas: Sequence[ReplicaState], ring: Ring, seq: int
    ) -> Decision | None:
        """The replica for one request; ``None`` when no replica is available."""
        ...


def load_cap(total_load: float, weight: int, total_weight: int, load_factor: float,
             floor: int = 0) -> int:
    """Bounded-load cap of one replica: ``max(ceil(c * (L + 1) * w / W), floor)``."""
    share = load_factor * (total_load + 1.0) * weight / total_weight
    # A hair below the exact product keeps float noise (1.1 * 50 / 5 == 11.000000000000002)
    # from granting one extra slot.
    return max(math.ceil(share - 1e-9), floor)


@dataclass(frozen=True)
class LoadBound:
    """The bounded-load rule (cap and floor), shared by the policy and the affinities that may
    move a request after it, so that no path can place a request past the cap."""

    load_factor: float
    floor: int

    def __post_init__(self) -> None:
        if not self.load_factor >= 1.0:
            raise ValueError(f"load_factor: expected a number >= 1, got {self.load_factor!r}")
        if self.floor < 0:
            raise ValueError(f"load_floor: expected >= 0, got {self.floor!r}")

    def cap(self, replica: ReplicaState, total_load: float, total_weight: int) -> int:
        return load_cap(total_load, replica.weight, total_weight, self.load_factor, self.floor)

    def admits(self, replica: ReplicaState, states: Sequence[ReplicaState]) -> bool:
        """Whether ``replica`` can take one more request (over the available ``states``)."""
        available = [s for s in states if s.available]
        total = sum(s.load() for s in available)
        weight = sum(s.weight for s in available)  # ReplicaState keeps weights >= 1
        return replica.load() < self.cap(replica, total, weight)


class BoundedLoadPrefixPolicy:
    name = "prefix"

    def __init__(self, load_factor: float, load_floor: int, spill_width: int = SPILL_WIDTH) -> None:
        if spill_width < 1:
            raise ValueError(f"spill_width: expected >= 1, got {spill_width!r}")
        self.bound = LoadBound(load_factor, load_floor)
        self.spill_width = spill_width

    def choose(
        self, key: RoutingKey, replicas: Sequence[ReplicaState], ring: Ring, seq: int
    ) -> Decision | None:
        available = _available(replicas)
        if not available:
            return None
        ring_key = key.ring_key
        if ring_key is None:
            return _least_loaded_decision(key, available, ring)
        order = _ring_order(ring, ring_key, available)
        home = order[0]
        loads = {name: r.load() for name, r in available.items()}
        total_load = sum(loads.values())
        total_weight = sum(r.weight for r in available.values())

        cap = self.bound.cap

        def under_cap(name: str) -> bool:
            return loads[name] < cap(available[name], total_load, total_weight)

        if under_cap(home):
            return moved_decision(home, _home_branch(key.source), order, home)
        for name in self._spill_order(order, key):
            if under_cap(name):
                return moved_decision(name, Branch.SPILL, order, home)
        return moved_decision(_least_loaded(available, order), Branch.FALLBACK, order, home)

    def _spill_order(self, order: list[str], key: RoutingKey) -> list[str]:
        rest = order[1:]
        if key.prefix is None or key.conversation is None or not key.sticky:
            return rest
        conversation = key.conversation
        ranked = sorted(
            rest[: self.spill_width],
            key=lambda name: xxhash.xxh3_64_intdigest(
                f"{conversation}\0{name}".encode("utf-8", "surrogatepass")
            ),
            reverse=True,
        )
        return ranked + rest[self.spill_width :]


class RoundRobinPolicy:
    name = "round_robin"

    def choose(
        self, key: RoutingKey, replicas: Sequence[ReplicaState], ring: Ring, seq: int
    ) -> Decision | None:
        names = sorted(_available(replicas))
        if not names:
            return None
        i = seq % len(names)
        rotation = tuple(names[i:] + names[:i])
        return Decision(rotation[0], Branch.ROUND_ROBIN, rotation)


class LeastLoadedPolicy:
    name = "least_loaded"

    def choose(
        self, key: RoutingKey, replicas: Sequence[ReplicaState], ring: Ring, seq: int
    ) -> Decision | None:
        available = _available(replicas)
        return _least_loaded_decision(key, available, ring) if available else None


def make_policy(name: str, load_factor: float, load_floor: int) -> Policy:
    """The policy ``name`` with the bounded-load settings of ``routing:`` (no defaults here:
    ``router.settings.RoutingSettings`` holds them). ``cache_aware`` is not a Policy: it is the
    pipeline that ``router.routing.Router`` assembles."""
    if name == "prefix":
        return BoundedLoadPrefixPolicy(load_factor, load_floor)
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "least_loaded":
        return LeastLoadedPolicy()
    raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {name!r}")


def _available(replicas: Sequence[ReplicaState]) -> dict[str, ReplicaState]:
    return {r.name: r for r in replicas if r.available}


def _ring_order(ring: Ring, key: str, available: dict[str, ReplicaState]) -> list[str]:
    """Available replicas in ring order from the key's home; any the ring does not know yet
    (membership and ring updated out of step) follow, by name."""
    order = [name for name in ring.walk(key) if name in available]
    if len(order) < len(available):
        placed = set(order)
        order += sorted(name for name in available if name not in placed)
    return order


def _home_branch(source: KeySource) -> Branch:
    if source is KeySource.HEADER:
        return Branch.OVERRIDE
    if source is KeySource.CONVERSATION:
        return Branch.CONVERSATION
    return Branch.HOME


def moved_decision(chosen: str, branch: Branch, order: Sequence[str], home: str | None) -> Decision:
    """A decision for ``chosen`` whose retry order is ``chosen`` then the rest of ``order``."""
    return Decision(chosen, branch, (chosen, *(n for n in order if n != chosen)), home)


def _relative_load(r: ReplicaState) -> float:
    return r.load() / r.weight


def _least_loaded(available: dict[str, ReplicaState], order: Sequence[str]) -> str:
    """Least load per unit of weight; ties go to the earliest in ``order``."""
    return min(order, key=lambda n: _relative_load(available[n]))


def _least_loaded_decision(
    key: RoutingKey, available: dict[str, ReplicaState], ring: Ring
) -> Decision:
    """Least loaded; ties in ring order from the key's home, or by name without a key."""
    ring_key = key.ring_key
    if ring_key is None:
        return _by_load(available, sorted(available), Branch.LEAST_LOADED, None)
    order = _ring_order(ring, ring_key, available)
    return _by_load(available, order, Branch.LEAST_LOADED, order[0])


def _by_load(
    available: dict[str, ReplicaState], order: Sequence[str], branch: Branch, home: str | None
) -> Decision:
    ranked = sorted(order, key=lambda n: _relative_load(available[n]))  # stable: ties keep order
    return Decision(ranked[0], branch, tuple(ranked), home)
