"""Replica state as the policy sees it, and the registry the server mutates.

:class:`ReplicaState` is deliberately mutable: the proxy bumps ``in_flight``, the health loop
flips ``healthy``, the scraper writes the ``vllm:*`` gauges, and membership updates own
``draining`` (endpoint not ready or terminating) and ``role``. The policy only reads it. ``models`` is what
the replica serves (`router.models`): from the endpoint when discovery or config names it
(``fixed_models``, plus the adapters of those the probes learn), else learned by the health
probes from ``/v1/models``.

:class:`ReplicaSet` maps names to states and owns the hash ring. Invariants:
- the ring contains every known replica, available or not, so a replica that flaps or drains
  sends only its own keys elsewhere and gets them back when it returns;
- ``update_membership`` keeps the state object of every surviving replica (counters, health)
  and rebuilds the ring only when the (name, weight, address) set changes;
- readers always see a consistent (states, ring) pair: both are replaced by assignment.

Cost: ``update_membership`` is O(N) plus a ring build (O(P log P)) when membership changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from router.ring import RING_KINDS, HashRing, Ring, RingMember, build_ring
from router.roles import DEFAULT_ROLE, Role

__all__ = ["EndpointLike", "ReplicaSet", "ReplicaState", "address_of"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass
class ReplicaState:
    name: str
    url: str
    weight: int = 1
    healthy: bool = True
    draining: bool = False
    in_flight: int = 0  # requests this router process has open on the replica
    running: float = 0.0  # vllm:num_requests_running (scraped)
    waiting: float = 0.0  # vllm:num_requests_waiting (scraped)
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc (scraped), 0..1
    kv_capacity: int = 0  # KV-cache tokens: num_gpu_blocks x block_size (scraped; 0 = unknown)
    # this router's requests on the replica that have not produced a first byte yet, and the
    # prompt tokens they are predicted to prefill there (written by the proxy's outcome hooks)
    unstarted: int = 0
    pending_prefill: float = 0.0
    scraped_unstarted: int = 0  # `unstarted` when `waiting` was scraped: ours among the waiting
    scraped_at: float | None = None  # when the last scrape that answered started (health clock)
    # the other router processes' attempts open on the replica, as they published them
    # (routing.peers, `router.peers.state`); 0 when peers are off
    peer_in_flight: int = 0
    # names served (base models and LoRA adapters); None while unknown (router.models)
    models: frozenset[str] | None = None
    parents: Mapping[str, str] = field(default_factory=dict)  # adapter -> base model
    # names given by config / discovery: always served; /v1/models adds only their adapters
    fixed_models: frozenset[str] | None = None
    lora_running: frozenset[str] = frozenset()  # vllm:lora_requests_info (latest label set)
    lora_waiting: frozenset[str] = frozenset()
    max_lora: int = 0  # 0: no LoRA information
    role: Role = DEFAULT_ROLE  # prefill | decode | both, from the endpoint (router.roles)

    def __post_init__(self) -> None:
        if self.weight < 1:
            raise ValueError(f"replica {self.name!r}: weight must be >= 1, got {self.weight}")

    @property
    def available(self) -> bool:
        return self.healthy and not self.draining

    def load(self) -> float:
        # in_flight is exact but only for this process (plus what its peers published); the
        # scraped gauges see every router worker's traffic but lag by a scrape interval. The
        # larger one is the safer estimate.
        return max(float(self.in_flight + self.peer_in_flight), self.running + self.waiting)


class EndpointLike(Protocol):
    """What discovery publishes (``router.discovery.Endpoint`` satisfies it)."""

    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def weight(self) -> int: ...


def address_of(url: str) -> str:
    """``host:port`` of a replica URL, with the scheme's default port made explicit."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
    return f"{host}:{port}"


class ReplicaSet:
    """Replica states by name plus the ring over them."""

    def __init__(
        self,
        endpoints: Iterable[EndpointLike] = (),
        *,
        ring_kind: str = "xxhash",
        vnodes: int = 160,
    ) -> None:
        self.ring_kind = ring_kind
        self.vnodes = vnodes
        self._states: dict[str, ReplicaState] = {}
        self._listed: tuple[ReplicaState, ...] = ()  # _states' values, built once per update
        if ring_kind not in RING_KINDS:
            raise ValueError(
                f"ring kind: expected one of {', '.join(RING_KINDS)}, got {ring_kind!r}"
            )
        self._ring: Ring = HashRing((), vnodes)
        self._signature: tuple[tuple[str, int, str], ...] | None = None
        self.update_membership(endpoints)

    @property
    def ring(self) -> Ring:
        return self._ring

    def states(self) -> tuple[ReplicaState, ...]:
        """All known replicas (available or not), sorted by name."""
        return self._listed

    def get(self, name: str) -> ReplicaState | None:
        return self._states.get(name)

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, name: object) -> bool:
        return name in self._states

    def update_membership(self, endpoints: Iterable[EndpointLike]) -> bool:
        """Replace the membership; returns True when the ring was rebuilt.

        A replica whose endpoint is not ready or is terminating is kept (and stays on the ring)
        but marked draining: it takes no new requests and gets its keys back once ready.
        """
        listed = sorted(endpoints, key=lambda e: e.name)
        names = [e.name for e in listed]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate replica names: {names}")
        signature = tuple((e.name, e.weight, address_of(e.url)) for e in listed)
        rebuilt = signature != self._signature
        ring = self._ring
        if rebuilt:
            # Built before any state is touched, so an invalid membership changes nothing.
            ring = self._build([RingMember(n, w, a) for n, w, a in signature])
        states: dict[str, ReplicaState] = {}
        for e in listed:
            draining = bool(getattr(e, "terminating", False)) or not getattr(e, "ready", True)
            state = self._states.get(e.name)
            if state is None:
                state = ReplicaState(name=e.name, url=e.url, weight=e.weight, draining=draining)
            else:
                if state.url != e.url:  # another process: its last scraped load is not kept
                    state.scraped_at = None
                state.url, state.weight, state.draining = e.url, e.weight, draining
            state.role = getattr(e, "role", DEFAULT_ROLE)
            fixed = getattr(e, "models", None)
            if fixed:
                if state.fixed_models != frozenset(fixed):
                    state.models = state.fixed_models = frozenset(fixed)
            elif state.fixed_models is not None:  # the explicit list was removed: learn it again
                state.models = state.fixed_models = None
            states[e.name] = state
        self._states, self._ring, self._signature = states, ring, signature
        self._listed = tuple(states.values())
        return rebuilt

    def _build(self, members: list[RingMember]) -> Ring:
        if not members:  # every kind agrees on the empty ring; nginx's needs no special case
            return HashRing((), self.vnodes)
        return build_ring(self.ring_kind, members, self.vnodes)
