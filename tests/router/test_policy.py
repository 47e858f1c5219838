"""Routing policies: bounded loads, conversation-stable spill, availability, determinism."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.keys import KeySource, RoutingKey
from router.policy import (
    BoundedLoadPrefixPolicy,
    Branch,
    Decision,
    LeastLoadedPolicy,
    RoundRobinPolicy,
    load_cap,
    make_policy,
)
from router.replicas import ReplicaSet, ReplicaState


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str
    weight: int = 1


def fleet(n: int = 4, weights: dict[str, int] | None = None) -> ReplicaSet:
    weights = weights or {}
    return ReplicaSet(
        Endpoint(f"r{i}", f"http://127.0.0.1:{8100 + i}", weights.get(f"r{i}", 1)) for i in range(n)
    )


def prefix_key(prefix: str, conversation: str | None = None, sticky: bool | None = None) -> RoutingKey:
    # a named conversation is sticky (has state to follow) unless a test says otherwise
    sticky = conversation is not None if sticky is None else sticky
    return RoutingKey(prefix, conversation, KeySource.PREFIX, 100, sticky)


def choose(policy: BoundedLoadPrefixPolicy, key: RoutingKey, rs: ReplicaSet) -> Decision:
    decision = policy.choose(key, rs.states(), rs.ring, 0)
    assert decision is not None
    return decision


def cap(rs: ReplicaSet, c: float = 1.25) -> int:
    available = [s for s in rs.states() if s.available]
    return math.ceil(c * (sum(s.load() for s in available) + 1) / len(available))


PREFIX = "9f" * 16


# (key source, prefix, conversation, expected branch on an idle fleet)
# fmt: off
BRANCHES = [
    pytest.param(KeySource.PREFIX, PREFIX, "c1", Branch.HOME, id="computed-prefix-at-home-is-home"),
    pytest.param(KeySource.HEADER, PREFIX, None, Branch.OVERRIDE, id="x-prefix-hash-at-home-is-override"),
    pytest.param(KeySource.CONVERSATION, None, "c1", Branch.CONVERSATION, id="conversation-key-at-home-is-conversation"),
    pytest.param(KeySource.NONE, None, None, Branch.LEAST_LOADED, id="no-key-is-least-loaded"),
]
# fmt: on


@pytest.mark.parametrize(("source", "prefix", "conversation", "branch"), BRANCHES)
def test_branch_label_on_an_idle_fleet(
    source: KeySource, prefix: str | None, conversation: str | None, branch: Branch
) -> None:
    rs = fleet()
    d = choose(BoundedLoadPrefixPolicy(1.25, 0), RoutingKey(prefix, conversation, source), rs)
    assert d.branch is branch
    ring_key = prefix or conversation
    if ring_key is not None:
        walk = list(rs.ring.walk(ring_key))
        assert d.replica == walk[0] == d.home
        assert d.candidates == tuple(walk)


def test_idle_fleet_sends_every_conversation_of_a_prefix_home() -> None:
    rs, policy = fleet(), BoundedLoadPrefixPolicy(1.25, 0)
    homes = {choose(policy, prefix_key(PREFIX, f"c{i}"), rs).replica for i in range(50)}
    assert homes == {next(rs.ring.walk(PREFIX))}


def test_spill_without_conversation_walks_the_ring() -> None:
    rs, policy = fleet(), BoundedLoadPrefixPolicy(1.25, 0)
    walk = list(rs.ring.walk(PREFIX))
    home = rs.get(walk[0])
    assert home is not None
    home.in_flight = 10  # cap with 10 in flight over 4 replicas: ceil(1.25 * 11 / 4) = 4
    d = choose(policy, prefix_key(PREFIX), rs)
    assert (d.replica, d.branch, d.home) == (walk[1], Branch.SPILL, walk[0])
    assert d.candidates == (walk[1], walk[0], *walk[2:])


def test_spill_of_a_first_turn_walks_the_ring_but_a_sticky_conversation_uses_rendezvous() -> None:
    rs, policy = fleet(8), BoundedLoadPrefixPolicy(1.25, 0, spill_width=3)
    walk = list(rs.ring.walk(PREFIX))
    home = rs.get(walk[0])
    assert home is not None
    home.in_flight = 20  # home is over its cap for every request below
    one_shot = {choose(policy, prefix_key(PREFIX, f"c{i}", sticky=False), rs).replica for i in range(40)}
    assert one_shot == {walk[1]}  # no state to follow: the overflow stays on one replica
    sticky = {choose(policy, prefix_key(PREFIX, f"c{i}", sticky=True), rs).replica for i in range(40)}
    assert sticky == set(walk[1:4])  # conversations spread over the spill_width candidates
    for i in range(40):  # ... and each one keeps its choice
        a = choose(policy, prefix_key(PREFIX, f"c{i}", sticky=True), rs).replica
        assert a == choose(policy, prefix_key(PREFIX, f"c{i}", sticky=True), rs).replica


def test_scraped_queue_counts_as_load() -> None:
    rs, policy = fleet(), BoundedLoadPrefixPolicy(1.25, 0)
    walk = list(rs.ring.walk(PREFIX))
    home = rs.get(walk[0])
    assert home is not None
    home.running, home.waiting = 6.0, 4.0  # another router worker's traffic
    assert choose(policy, prefix_key(PREFIX), rs).branch is Branch.SPILL


def test_hot_prefix_spreads_under_the_cap_and_conversations_stick() -> None:
    rs, policy = fleet(4), BoundedLoadPrefixPolicy(1.25, 0)
    conversations = [f"conv-{i}" for i in range(200)]
    placed: dict[str, str] = {}
    branches: Counter[Branch] = Counter()
    for conv in conversations:  # 200 concurrent first turns of one hot prefix
        d = choose(policy, prefix_key(PREFIX, conv), rs)
        placed[conv] = d.replica
        branches[d.branch] += 1
        state = rs.get(d.replica)
        assert state is not None
        state.in_flight += 1
    loads = [s.in_flight for s in rs.states()]
    assert sum(loads) == 200
    assert max(loads) / (200 / 4) <= 1.3
    assert min(loads) > 0
    assert branches[Branch.HOME] > 0 and branches[Branch.SPILL] > 0
    rng = random.Random(11)
    for turn in range(6):  # each conversation finishes a turn and sends the next one
        rng.shuffle(conversations)
        moved = 0
        for conv in conversations:
            state = rs.get(placed[conv])
            assert state is not None
            state.in_flight -= 1
            d = choose(policy, prefix_key(PREFIX, conv), rs)
            moved += d.replica != placed[conv]
            placed[conv] = d.replica
            state = rs.get(d.replica)
            assert state is not None
            state.in_flight += 1
        # The burst above placed early spills while caps were still tiny, so a few landed on
        # their second choice and move once; from then on nobody moves.
        assert moved <= (len(conversations) // 20 if turn == 0 else 0)


def test_cap_is_never_exceeded_while_placing_many_hot_prefixes() -> None:
    rs, policy = fleet(5), BoundedLoadPrefixPolicy(1.1, 0)
    rng = random.Random(5)
    hot = [f"{rng.getrandbits(64):016x}" for _ in range(3)]
    for i in range(400):
        limit = cap(rs, 1.1)
        d = choose(policy, prefix_key(rng.choice(hot), f"c{i}"), rs)
        state = rs.get(d.replica)
        assert state is not None and state.in_flight < limit
        state.in_flight += 1


replica_strategy = st.tuples(
    st.integers(0, 30),  # in_flight
    st.floats(0, 30, allow_nan=False),  # running + waiting as scraped
    st.booleans(),  # healthy
    st.booleans(),  # draining
    st.integers(1, 3),  # weight
)


@settings(max_examples=120, deadline=None)
@given(
    replicas=st.lists(replica_strategy, min_size=1, max_size=8),
    prefix=st.text(min_size=1, max_size=8),
    conversation=st.one_of(st.none(), st.text(min_size=1, max_size=8)),
    load_factor=st.floats(1.0, 2.0),
)
def test_bounded_load_holds_whenever_a_replica_is_under_cap(
    replicas: list[tuple[int, float, bool, bool, int]],
    prefix: str,
    conversation: str | None,
    load_factor: float,
) -> None:
    rs = ReplicaSet(
        Endpoint(f"r{i}", f"http://127.0.0.1:{9000 + i}", w)
        for i, (_, _, _, _, w) in enumerate(replicas)
    )
    for i, (in_flight, scraped, healthy, draining, _) in enumerate(replicas):
        state = rs.get(f"r{i}")
        assert state is not None
        state.in_flight, state.running, state.healthy, state.draining = (
            in_flight,
            scraped,
            healthy,
            draining,
        )
    available = [s for s in rs.states() if s.available]
    d = BoundedLoadPrefixPolicy(load_factor, 0).choose(
        prefix_key(prefix, conversation), rs.states(), rs.ring, 0
    )
    if not available:
        assert d is None
        return
    assert d is not None
    assert sorted(d.candidates) == sorted(s.name for s in available)
    assert d.candidates[0] == d.replica
    total, weight = sum(s.load() for s in available), sum(s.weight for s in available)

    def under(s: ReplicaState) -> bool:
        return s.load() < math.ceil(load_factor * (total + 1) * s.weight / weight - 1e-9)

    chosen = rs.get(d.replica)
    assert chosen is not None
    # The caps sum to at least c * (total + 1) > total, so some replica is always under cap.
    assert any(under(s) for s in available)
    assert under(chosen)
    assert d.branch in (Branch.HOME, Branch.SPILL)


@pytest.mark.parametrize("flag", ["healthy", "draining"])
def test_unavailable_home_is_skipped_and_never_a_candidate(flag: str) -> None:
    rs, policy = fleet(), BoundedLoadPrefixPolicy(1.25, 0)
    walk = list(rs.ring.walk(PREFIX))
    home = rs.get(walk[0])
    assert home is not None
    setattr(home, flag, flag == "draining")
    d = choose(policy, prefix_key(PREFIX, "c"), rs)
    assert (d.replica, d.branch) == (walk[1], Branch.HOME)
    assert d.candidates == tuple(walk[1:])


def test_unavailable_replica_moves_only_its_own_keys() -> None:
    rs, policy = fleet(6), BoundedLoadPrefixPolicy(1.25, 0)
    keys = [f"{i:032x}" for i in range(600)]
    before = {k: choose(policy, prefix_key(k), rs).replica for k in keys}
    down = rs.get("r2")
    assert down is not None
    down.healthy = False
    after = {k: choose(policy, prefix_key(k), rs).replica for k in keys}
    assert {k for k in keys if before[k] != after[k]} == {k for k in keys if before[k] == "r2"}


def test_no_available_replica_gives_none() -> None:
    rs = fleet(3)
    for s in rs.states():
        s.healthy = False
    key = prefix_key(PREFIX)
    assert BoundedLoadPrefixPolicy(1.25, 0).choose(key, rs.states(), rs.ring, 0) is None
    assert RoundRobinPolicy().choose(key, rs.states(), rs.ring, 0) is None
    assert LeastLoadedPolicy().choose(key, rs.states(), rs.ring, 0) is None


def test_independent_replica_sets_make_identical_decisions() -> None:
    endpoints = [Endpoint(f"pod-{i}", f"http://10.1.0.{i}:8000") for i in range(7)]
    shuffled = endpoints[:]
    random.Random(2).shuffle(shuffled)
    a, b = ReplicaSet(endpoints), ReplicaSet(shuffled)
    rng = random.Random(9)
    for name in ("pod-1", "pod-4"):
        for rs in (a, b):
            state = rs.get(name)
            assert state is not None
            state.in_flight = 40
    policy = make_policy("prefix", 1.25, 0)
    for i in range(1000):
        key = prefix_key(f"{rng.getrandbits(128):032x}", f"c{i % 37}")
        assert policy.choose(key, a.states(), a.ring, i) == policy.choose(
            key, b.states(), b.ring, i
        )


def test_round_robin_cycles_available_replicas_by_name() -> None:
    rs, policy = fleet(4), RoundRobinPolicy()
    r1 = rs.get("r1")
    assert r1 is not None
    r1.draining = True
    key = prefix_key(PREFIX)
    picks = [policy.choose(key, rs.states(), rs.ring, seq) for seq in range(6)]
    assert [d.replica for d in picks if d] == ["r0", "r2", "r3", "r0", "r2", "r3"]
    assert picks[1] is not None and picks[1].candidates == ("r2", "r3", "r0")
    assert {d.branch for d in picks if d} == {Branch.ROUND_ROBIN}


def test_least_loaded_picks_min_load_ties_in_ring_order() -> None:
    rs, policy = fleet(4), LeastLoadedPolicy()
    walk = list(rs.ring.walk(PREFIX))
    d = policy.choose(prefix_key(PREFIX), rs.states(), rs.ring, 0)
    assert d is not None and d.replica == walk[0]  # all idle: the key's home wins the tie
    for i, name in enumerate(walk):
        state = rs.get(name)
        assert state is not None
        state.in_flight = 5 - i
    d = policy.choose(prefix_key(PREFIX), rs.states(), rs.ring, 0)
    assert d is not None and d.replica == walk[-1] and d.candidates == tuple(reversed(walk))


def test_least_loaded_without_key_ties_by_name() -> None:
    rs = fleet(4)
    none = RoutingKey(None, None, KeySource.NONE)
    for policy in (LeastLoadedPolicy(), BoundedLoadPrefixPolicy(1.25, 0)):
        d = policy.choose(none, rs.states(), rs.ring, 0)
        assert d is not None and (d.replica, d.branch) == ("r0", Branch.LEAST_LOADED)


def test_make_policy_by_name() -> None:
    assert make_policy("prefix", 1.5, 0).name == "prefix"
    assert make_policy("round_robin", 1.25, 0).name == "round_robin"
    assert make_policy("least_loaded", 1.25, 0).name == "least_loaded"
    with pytest.raises(ValueError, match="policy"):
        make_policy("random", 1.25, 0)
    with pytest.raises(ValueError, match="load_factor"):
        make_policy("prefix", 0.9, 0)


def test_public_names_and_labels_are_pinned() -> None:
    # Branch values are metric labels and key sources appear in access logs: renaming one is a
    # breaking change, so this list changes only on purpose.
    from router import client, keys, policy, replicas, ring

    assert [b.value for b in Branch] == [
        "home", "spill", "override", "conversation", "fallback", "round_robin", "least_loaded",
        "cache_hit",
        "lora_affinity", "decode_load",
    ]  # fmt: skip
    assert [s.value for s in KeySource] == ["header", "prefix", "conversation", "none"]
    assert sorted(keys.__all__) == [
        "KeyConfig", "KeySource", "PrefixExplanation", "RoutingKey", "VolatileCut",
        "api_kind", "canonical_prefix", "derive", "explain", "key_config",
    ]  # fmt: skip
    assert sorted(ring.__all__) == ["HashRing", "RING_KINDS", "Ring", "RingMember", "build_ring"]
    assert sorted(policy.__all__) == [
        "BoundedLoadPrefixPolicy", "Branch", "Decision", "LeastLoadedPolicy", "LoadBound",
        "POLICIES", "Policy", "RoundRobinPolicy", "load_cap", "make_policy", "moved_decision",
    ]  # fmt: skip
    assert sorted(replicas.__all__) == ["EndpointLike", "ReplicaSet", "ReplicaState", "address_of"]
    assert sorted(client.__all__) == ["MODEL_HEADER", "hash_key", "prefix_headers",
                                      "routing_headers"]
    for module in (client, keys, policy, replicas, ring):
        assert all(hasattr(module, name) for name in module.__all__)


# fmt: off
CAPS = [
    pytest.param(0, 1, 4, 1.25, 1, id="idle-fleet-allows-one"),
    pytest.param(199, 1, 4, 1.25, 63, id="hot-200-over-4"),
    pytest.param(49, 1, 5, 1.1, 11, id="float-noise-does-not-add-a-slot"),
    pytest.param(10, 2, 3, 1.0, 8, id="weight-two-of-three-gets-two-thirds"),
]
# fmt: on


@pytest.mark.parametrize(("total", "weight", "total_weight", "c", "expected"), CAPS)
def test_load_cap(total: float, weight: int, total_weight: int, c: float, expected: int) -> None:
    assert load_cap(total, weight, total_weight, c) == expected


def test_load_cap_floor() -> None:
    assert load_cap(2, 1, 4, 1.25) == 1  # ceil(1.25 * 3 / 4)
    assert load_cap(2, 1, 4, 1.25, floor=4) == 4  # low load: the floor wins
    assert load_cap(100, 1, 4, 1.25, floor=4) == 32  # high load: the bounded-load cap wins


def test_load_floor_keeps_low_load_traffic_home_and_still_bounds_high_load() -> None:
    rs = fleet(4)
    pure, floored = BoundedLoadPrefixPolicy(1.25, 0), BoundedLoadPrefixPolicy(1.25, 4)
    walk = list(rs.ring.walk(PREFIX))
    home = rs.get(walk[0])
    assert home is not None
    home.in_flight = 3  # 3 in flight on the home, nothing elsewhere: cap ceil(1.25*4/4) = 2
    assert choose(pure, prefix_key(PREFIX), rs).branch is Branch.SPILL
    assert choose(floored, prefix_key(PREFIX), rs).branch is Branch.HOME
    home.in_flight = 4  # the floor is reached: spill
    assert choose(floored, prefix_key(PREFIX), rs).branch is Branch.SPILL
    for s in rs.states():
        s.in_flight = 40
    home.in_flight = 60  # high load: ceil(1.25 * 181 / 4) = 57 < 60, the floor is irrelevant
    assert choose(floored, prefix_key(PREFIX), rs).branch is Branch.SPILL
    with pytest.raises(ValueError):
        BoundedLoadPrefixPolicy(1.25, -1)
