"""Which replicas serve which model: the model pool of a request, and LoRA affinity. Pure.

Membership. Each replica's `ReplicaState.models` is the set of names it serves (base models and
LoRA adapters) or ``None`` while unknown; `ReplicaState.parents` maps an adapter to its base
model. The set comes from ``replicas[].models`` (static config) or the Kubernetes model label -
then those names are always served and ``/v1/models`` adds only adapters whose parent is one of
them - or else it is learned from the replica's ``GET /v1/models`` with the health probes
(`served_models`: vLLM lists an adapter with ``parent`` set to its base).

Pool (`select_pool`, the first routing stage: everything after it - key, bounded-load cap,
index, retries, fallback - sees only the pool's replicas). With the *catalog* the union of the
known lists:

- empty catalog (no list known yet, or a fleet that hides ``/v1/models``): model-blind, every
  replica is in the pool (status ``blind``);
- a request without a string ``model``: every replica whose list is known, each serves its
  default model as vLLM does (``blind``);
- ``model`` in the catalog: the replicas that list it, plus - when the known lists have a single
  base model and ``model`` is that base - the replicas whose list is still unknown ("unless the
  fleet has a single model"). None of them available -> ``down`` (503 with Retry-After);
- ``model`` not in the catalog: ``pending`` (503) while an available replica's list is unknown
  in a multi-model fleet (it may serve it), else ``not_found`` (404 ``model_not_found``).

The pool's metric label is the model's name when the catalog lists it, else ``unknown``: label
values are bounded by the membership, never by client input.

LoRA affinity (`lora_affinity`, a stage after the policy's choice, inside the pool): for an
adapter, the replicas available and under the bounded-load cap are ranked in tiers - 1. the
adapter is in ``running_lora_adapters`` or ``waiting_lora_adapters`` of the replica's latest
``vllm:lora_requests_info`` (loaded: no swap); 2. it has a free slot (fewer adapters than
``max_lora``, or no LoRA information at all); 3. the rest, which would have to swap an adapter
out. If the policy's choice is not in the best non-empty tier, the request moves to that tier's
first replica in the decision's own candidate order (its ring/prefix preference), branch
``lora_affinity``. Replicas at ``max_lora`` are used only when they are the only ones under the
cap; nothing under the cap -> the decision is kept (its ``fallback``).

Cost: `select_pool` is O(N x models) per call for N replicas; `ModelPools` (what the app
calls) keeps the catalog and each model's pool until a replica or a model list changes, so a
request costs O(N) identity checks and the pool's availability scan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from router.policy import Branch, Decision, LoadBound, moved_decision
from router.replicas import ReplicaState

__all__ = [
    "UNKNOWN",
    "ModelPools",
    "Pool",
    "PoolStatus",
    "ServedModels",
    "catalog",
    "lora_affinity",
    "select_pool",
    "served_models",
]

UNKNOWN = "unknown"  # the metric label of a model the membership does not list


class PoolStatus(StrEnum):
    OK = "ok"
    BLIND = "blind"
    DOWN = "down"
    PENDING = "pending"
    NOT_FOUND = "not_found"


@dataclass(frozen=True)
class ServedModels:
    """The names one replica serves and the base model of each adapter among them."""

    names: frozenset[str]
    parents: Mapping[str, str]


def served_models(listing: Any) -> ServedModels | None:
    """The model set of a ``/v1/models`` answer (``None`` when it is not a model list).

    Entries without a string ``id`` are skipped; ``parent`` (vLLM: the base model of a LoRA
    adapter, ``null`` for a base model) is kept when it is a non-empty string other than the
    entry's own id."""
    data = listing.get("data") if isinstance(listing, Mapping) else None
    if not isinstance(data, list):
        return None
    names: set[str] = set()
    parents: dict[str, str] = {}
    for entry in data:
        mid = entry.get("id") if isinstance(entry, Mapping) else None
        if not isinstance(mid, str) or not mid:
            continue
        names.add(mid)
        parent = entry.get("parent")
        if isinstance(parent, str) and parent and parent != mid:
            parents[mid] = parent
    return ServedModels(frozenset(names), parents)


def catalog(states: Iterable[ReplicaState]) -> frozenset[str]:
    """Every name some replica with a known list serves."""
    out: set[str] = set()
    for s in states:
        if s.models is not None:
            out |= s.models
    return frozenset(out)


def _bases(states: Iterable[ReplicaState]) -> set[str]:
    out: set[str] = set()
    for s in states:
        if s.models is not None:
            out |= {m for m in s.models if m not in s.parents}
    return out


@dataclass(frozen=True)
class Pool:
    status: PoolStatus
    members: tuple[ReplicaState, ...]  # the pool's replicas, available or not
    label: str  # the ``model`` metric label
    adapter: bool = False  # the model is a LoRA adapter of some replica


def select_pool(model: object, states: Sequence[ReplicaState]) -> Pool:
    """The replicas a request for ``model`` may go to (rules in the module docstring)."""
    return _Catalog(states).pool(model)


class _Catalog:
    """The model lists of one membership, and the pools computed from them (each pool's
    members once per model; its status, which follows availability, per call)."""

    __slots__ = ("_blind", "_known", "_pools", "bases", "names", "states")

    def __init__(self, states: Sequence[ReplicaState]) -> None:
        self.states = tuple(states)
        self.names = catalog(self.states)
        self.bases = _bases(self.states)
        self._blind = Pool(PoolStatus.BLIND, self.states, UNKNOWN)  # model-blind: everyone
        self._known: Pool | None = None  # BLIND over the replicas whose list is known
        self._pools: dict[str, tuple[Pool, Pool]] = {}  # model in names -> (OK, DOWN)

    def pool(self, model: object) -> Pool:
        states = self.states
        if not self.names:
            return self._blind
        if not isinstance(model, str) or not model:
            if self._known is None:
                self._known = Pool(PoolStatus.BLIND,
                                   tuple(s for s in states if s.models is not None), UNKNOWN)
            return self._known
        if model not in self.names:
            waiting = any(s.models is None and s.available for s in states)
            if waiting and len(self.bases) > 1:
                return Pool(PoolStatus.PENDING, (), UNKNOWN)
            return Pool(PoolStatus.NOT_FOUND, (), UNKNOWN)
        pools = self._pools.get(model)
        if pools is None:
            single = len(self.bases) == 1 and model in self.bases
            members = tuple(s for s in states
                            if (model in s.models if s.models is not None else single))
            adapter = any(model in s.parents for s in members)
            pools = self._pools[model] = (Pool(PoolStatus.OK, members, model, adapter),
                                          Pool(PoolStatus.DOWN, members, model, adapter))
        ok, down = pools
        return ok if any(s.available for s in ok.members) else down


class ModelPools:
    """`select_pool`, remembering the catalog and each model's members while the states
    sequence (`router.replicas.ReplicaSet.states`: replaced on every membership change) and
    every replica's model list stay the same objects.

    Invariant: a replica's ``models`` and ``parents`` are replaced, never changed in place
    (`router.health` and `router.replicas` assign new ones), so comparing them by identity is
    exact; any change - a replica joined or left, a list learned or replaced - rebuilds the
    catalog at the next call. Cost: O(N) identity checks per call plus the availability scan of
    the pool; O(N x models) once per change."""

    __slots__ = ("_catalog", "_seen", "_states")

    def __init__(self) -> None:
        self._catalog: _Catalog | None = None
        self._states: Sequence[ReplicaState] | None = None  # the sequence it was built from
        self._seen: tuple[tuple[ReplicaState, object, object], ...] = ()

    def select(self, model: object, states: Sequence[ReplicaState]) -> Pool:
        cat = self._catalog
        if (cat is None or states is not self._states or len(states) != len(self._seen)
                or not self._unchanged()):
            cat = self._rebuild(states)
        return cat.pool(model)

    def _unchanged(self) -> bool:
        for s, models, parents in self._seen:
            if s.models is not models or s.parents is not parents:
                return False
        return True

    def _rebuild(self, states: Sequence[ReplicaState]) -> _Catalog:
        cat = self._catalog = _Catalog(states)
        self._states = states
        self._seen = tuple((s, s.models, s.parents) for s in cat.states)
        return cat


def _tier(r: ReplicaState, adapter: str) -> int:
    if adapter in r.lora_running or adapter in r.lora_waiting:
        return 0
    if r.max_lora <= 0 or len(r.lora_running | r.lora_waiting) < r.max_lora:
        return 1
    return 2


def lora_affinity(adapter: str, decision: Decision, members: Sequence[ReplicaState],
                  bound: LoadBound) -> Decision:
    """``decision`` moved to a replica that holds ``adapter`` or has a free slot, if the
    chosen one does not and such a replica is under the cap (module docstring)."""
    available = [s for s in members if s.available]
    total = sum(s.load() for s in available)
    weight = sum(s.weight for s in available)
    under = {s.name: s for s in available if s.load() < bound.cap(s, total, weight)}
    if not under:
        return decision
    tiers = {name: _tier(s, adapter) for name, s in under.items()}
    best = min(tiers.values())
    if tiers.get(decision.replica) == best:
        return decision
    target = next((n for n in decision.candidates if tiers.get(n) == best), None)
    if target is None:  # a replica the decision does not list (cannot happen; keeps it total)
        target = min(n for n, t in tiers.items() if t == best)
    return moved_decision(target, Branch.LORA_AFFINITY, decision.candidates, decision.home)
