"""A model of sglang-router's ``cache_aware`` decision, for the simulator (``sglang_model``).

sglang-router cannot run inside the discrete-event simulation (it is a Rust HTTP server), so
this is its decision procedure re-stated, to compare with the router's pipeline *request by
request on the same simulated fleet* (`loadtest.simulate`, ``--policy sglang_model``). It is a
model, not the benchmark: `make bench` runs the real sglang-router. What it reproduces (from
sglang-router 0.3.x's ``policies/cache_aware.rs`` and its defaults):

- load = requests the router has in flight on a worker; the fleet is *imbalanced* when
  ``max - min > balance_abs_threshold`` (64) and ``max > balance_rel_threshold`` (1.5) x min:
  then the least loaded worker, and the request's text is still inserted into its tree;
- otherwise the longest prefix match of the request text over the per-worker trees;
  match rate = matched characters / text characters; above ``cache_threshold`` (0.3): the
  worker holding the match, else the worker whose tree holds the fewest characters;
- the chosen worker's tree gets the text at selection time (before any response);
- trees are evicted only past ``max_tree_size`` (2^26 characters) every 60 s: never, at these
  sizes, so a tree does not age out when the replica's KV cache evicts.

The character radix tree is approximated by chained hashes of ``GRAIN``-character pieces of the
text (`router.chunks` with message boundaries), so a match is exact to within one piece. Ties
between workers holding the same deepest piece go to the most recent inserter.

Cost: O(text) hashing and O(pieces) dict work per request; memory grows with distinct text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.chunks import request_chunks
from router.keys import KeySource, RoutingKey
from router.policy import Branch, Decision
from router.replicas import ReplicaSet
from router.routing import Routed

__all__ = ["GRAIN", "NAME", "SglangModel"]

NAME = "sglang_model"
GRAIN = 64  # characters per hashed piece (the tree's resolution in this model)
_KEY = RoutingKey(None, None, KeySource.NONE)


class SglangModel:
    """sglang-router cache_aware's routing decision over a `ReplicaSet` (module docstring)."""

    def __init__(self, replicas: ReplicaSet, cache_threshold: float = 0.3,
                 balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5) -> None:
        self.replicas = replicas
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs_threshold
        self.balance_rel = balance_rel_threshold
        self._holders: dict[int, dict[str, int]] = {}  # piece hash -> worker -> insert order
        self._size: dict[str, int] = {}  # characters in each worker's tree
        self._clock = 0

    def route(self, path: str, headers: Mapping[str, str], body: Mapping[str, Any] | None,
              seq: int) -> Routed | None:
        states = [r for r in self.replicas.states() if r.available]
        if not states:
            return None
        # token estimates at 1 char per token: the chunks' "tokens" are characters here
        chunks = request_chunks(path, body, GRAIN, 1.0)
        loads = {r.name: r.in_flight for r in states}
        hi, lo = max(loads.values()), min(loads.values())
        if hi - lo > self.balance_abs and hi > lo * self.balance_rel:
            pick = min(states, key=lambda r: loads[r.name]).name
            branch = Branch.LEAST_LOADED
        else:
            matched, holder = self._match(chunks.hashes, chunks.tokens)
            rate = matched / chunks.total if chunks.total else 0.0
            if holder is not None and rate > self.cache_threshold:
                pick, branch = holder, Branch.CACHE_HIT
            else:
                # min keeps the first of equal sizes: ties go to the earliest replica
                pick = min((r.name for r in states), key=lambda n: self._size.get(n, 0))
                branch = Branch.HOME
        self._insert(pick, chunks.hashes, chunks.tokens)
        order = (pick, *(r.name for r in states if r.name != pick))
        return Routed(_KEY, Decision(pick, branch, order), chunks, {}, None, None)

    def _match(self, hashes: tuple[int, ...], chars: tuple[int, ...]) -> tuple[int, str | None]:
        matched, holder = 0, None
        for h, c in zip(hashes, chars, strict=True):
            held = self._holders.get(h)
            if not held:
                break
            matched, holder = c, max(held, key=held.__getitem__)
        return matched, holder

    def _insert(self, worker: str, hashes: tuple[int, ...], chars: tuple[int, ...]) -> None:
        self._clock += 1
        prev = 0
        for h, c in zip(hashes, chars, strict=True):
            held = self._holders.setdefault(h, {})
            if worker not in held:
                self._size[worker] = self._size.get(worker, 0) + c - prev
            held[worker] = self._clock
            prev = c
