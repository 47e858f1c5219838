"""Prefill/decode disaggregation, the routing half: which pool serves which phase. Pure.

A model pool (`router.models.Pool`) is *disaggregated* when its members - available or not -
include a replica of role ``prefill`` and one of role ``decode`` (`router.roles`); a ``both``
replica then belongs to both phases. Any other pool is served in one phase, as before
(`split` returns None). Deciding on membership, not availability, keeps the mode stable while
instances fail: a disaggregated pool whose decode instances are all down answers 503, it does
not start decoding on its prefill instances. A role change by discovery takes effect at the
next request.

The prefill phase is routed by `router.routing.Router.route` over `split`'s prefill pool - the
same pipeline as every other request, restricted to those members - so the prefix index, the
bounded load and the retry order all concern the prefill instances, whose prefix caches are the
ones that matter. The decode phase is placed by `pick_decode`: least queued work per unit of
weight over the available decode members, the pipeline's own measure (`router.pipeline.
queued_work`: this router's unanswered prefill, ``decode_tokens`` per request running or
waiting there - in flight at this router or scraped, whichever is larger - and the KV-pressure
term above ``kv_high`` for a prompt of this size); instances within one request's decode work
(``decode_tokens``) of the least are tied, and a tie goes to the first of them in the request
key's ring order (then by name). So a prefix keeps its decode instance while loads are close,
and that instance's own prefix cache spares part of the transfer (vLLM pulls only the blocks
the decode instance lacks); load still decides as soon as it differs by more than a request.
Branch ``decode_load``.

Cost: `split` O(members); `pick_decode` O(decode members).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.models import Pool
from router.pipeline import queued_work
from router.policy import Branch, Decision
from router.replicas import ReplicaState
from router.roles import Role

__all__ = ["Phases", "pick_decode", "split"]


class Phases:
    """The two phases' members of a disaggregated pool."""

    __slots__ = ("decode", "prefill")

    def __init__(self, prefill: Pool, decode: tuple[ReplicaState, ...]) -> None:
        self.prefill = prefill
        self.decode = decode


def split(pool: Pool) -> Phases | None:
    """The prefill pool and the decode members of ``pool``; None when it is not disaggregated."""
    members = pool.members
    roles = {r.role for r in members}
    if Role.PREFILL not in roles or Role.DECODE not in roles:
        return None
    prefill = tuple(r for r in members if r.role is not Role.DECODE)
    decode = tuple(r for r in members if r.role is not Role.PREFILL)
    return Phases(Pool(pool.status, prefill, pool.label, pool.adapter), decode)


def pick_decode(members: Sequence[ReplicaState], prompt_tokens: int, decode_tokens: float,
                mean_prefill: float, kv_high: float,
                rank: Mapping[str, int] | None = None) -> Decision | None:
    """The decode instance for a request of ``prompt_tokens`` (None: none available). Its only
    candidate is itself: a decode phase is never retried elsewhere. Instances whose work is
    within one request's decode (``decode_tokens``) of the least count as tied; ties go to the
    lowest ``rank`` (the request key's ring order), then the name."""
    work: list[tuple[float, ReplicaState]] = [
        (queued_work(r, prompt_tokens, decode_tokens, mean_prefill, kv_high) / r.weight, r)
        for r in members if r.available]
    if not work:
        return None
    least = min(w for w, _ in work)
    order = rank or {}
    tied = [r for w, r in work if w <= least + decode_tokens]
    best = min(tied, key=lambda r: (order.get(r.name, len(order)), r.name))
    return Decision(best.name, Branch.DECODE_LOAD, (best.name,))
