"""`router.disagg_routing`: which pools serve which phase, and the decode pick. Table-driven."""

from __future__ import annotations

import pytest

from router.disagg_routing import pick_decode, split
from router.models import Pool, PoolStatus
from router.policy import Branch
from router.replicas import ReplicaState
from router.roles import Role

P, D, B = Role.PREFILL, Role.DECODE, Role.BOTH


def pool(*roles: Role) -> Pool:
    return Pool(PoolStatus.OK, tuple(ReplicaState(f"r{i}", f"http://h:{i + 1}", role=role)
                                     for i, role in enumerate(roles)), "m")


@pytest.mark.parametrize(("roles", "prefill", "decode"), [
    ((B, B), None, None),            # an ordinary fleet: one phase, as before
    ((P, P), None, None),            # prefill instances only: one phase
    ((D, B), None, None),            # no prefill role: one phase
    ((P, D), ["r0"], ["r1"]),        # both roles: two phases
    ((P, D, B), ["r0", "r2"], ["r1", "r2"]),  # a both replica takes part in both
])
def test_split(roles: tuple[Role, ...], prefill: list[str] | None,
               decode: list[str] | None) -> None:
    phases = split(pool(*roles))
    if prefill is None:
        assert phases is None
        return
    assert phases is not None
    assert [r.name for r in phases.prefill.members] == prefill
    assert [r.name for r in phases.decode] == decode
    assert phases.prefill.label == "m" and phases.prefill.status is PoolStatus.OK


def test_split_keeps_unavailable_members() -> None:
    p = pool(P, D)
    p.members[1].healthy = False
    phases = split(p)  # the mode follows membership: an unhealthy decode leaves it two-phase
    assert phases is not None and [r.name for r in phases.decode] == ["r1"]


def replica(name: str, **state: float) -> ReplicaState:
    r = ReplicaState(name, f"http://{name}:1", role=D)
    for k, v in state.items():
        setattr(r, k, v)
    return r


@pytest.mark.parametrize(("replicas", "rank", "want"), [
    # least queued work wins (decode_tokens 32 per request in flight)
    ([replica("a", in_flight=3), replica("b", in_flight=1)], None, "b"),
    # scraped running + waiting counts when larger than this router's own
    ([replica("a", running=6), replica("b", in_flight=2)], None, "b"),
    # unanswered prefill queued there counts too (a both replica)
    ([replica("a", pending_prefill=500), replica("b", in_flight=2)], None, "b"),
    # KV pressure above kv_high (0.9) weighs the request's prompt (1000 tokens)
    ([replica("a", kv_usage=0.99), replica("b", in_flight=5)], None, "b"),
    # within one request's decode of the least: tied, the key's ring order decides
    ([replica("a"), replica("b", in_flight=1)], {"b": 0, "a": 1}, "b"),
    ([replica("a"), replica("b")], None, "a"),                  # no key: by name
    ([replica("a", healthy=False), replica("b", in_flight=9)], None, "b"),  # only available
])
def test_pick_decode(replicas: list[ReplicaState], rank: dict[str, int] | None,
                     want: str) -> None:
    d = pick_decode(replicas, 1000, 32.0, 0.0, 0.9, rank)
    assert d is not None
    assert (d.replica, d.branch, d.candidates) == (want, Branch.DECODE_LOAD, (want,))


def test_pick_decode_none_available() -> None:
    r = replica("a")
    r.draining = True
    assert pick_decode([r], 100, 32.0, 0.0, 0.9) is None
