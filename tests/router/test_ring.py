"""Hash ring: walk contract, minimal remapping on membership change, balance, determinism."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from router.ring import HashRing, RingMember, build_ring

_rng = random.Random(7)
KEYS = [f"{_rng.getrandbits(128):032x}" for _ in range(10_000)]


def members(n: int, **weights: int) -> list[RingMember]:
    names = [f"r{i}" for i in range(n)]
    return [
        RingMember(name, weights.get(name, 1), f"10.0.0.{i}:8000") for i, name in enumerate(names)
    ]


def homes(ring: HashRing) -> dict[str, str]:
    return {k: next(ring.walk(k)) for k in KEYS}


def test_walk_yields_every_member_once_starting_at_home() -> None:
    ring = HashRing(members(8))
    for k in KEYS[:200]:
        walked = list(ring.walk(k))
        assert sorted(walked) == [f"r{i}" for i in range(8)]
        assert walked[0] == ring.home(k)


def test_empty_ring_walks_nothing() -> None:
    assert list(HashRing([]).walk("k")) == []
    assert HashRing([]).home("k") is None


def test_member_input_order_does_not_matter() -> None:
    ms = members(6)
    shuffled = ms[:]
    random.Random(3).shuffle(shuffled)
    a, b = HashRing(ms), HashRing(shuffled)
    assert all(list(a.walk(k)) == list(b.walk(k)) for k in KEYS[:1000])


def test_addresses_do_not_move_keys() -> None:
    moved = [RingMember(m.name, m.weight, "192.168.1.1:9") for m in members(4)]
    a, b = HashRing(members(4)), HashRing(moved)
    assert homes(a) == homes(b)


def test_removing_one_of_eight_moves_only_its_keys() -> None:
    full = HashRing(members(8))
    before = homes(full)
    removed = "r3"
    after = homes(HashRing([m for m in members(8) if m.name != removed]))
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == {k for k in KEYS if before[k] == removed}
    assert abs(len(moved) / len(KEYS) - 1 / 8) < 0.04


def test_removal_keeps_everyones_walk_minus_the_removed() -> None:
    full, smaller = HashRing(members(8)), HashRing(members(7))  # r7 removed
    for k in KEYS[:500]:
        assert list(smaller.walk(k)) == [n for n in full.walk(k) if n != "r7"]


def test_adding_a_ninth_moves_about_one_ninth_all_to_the_newcomer() -> None:
    before = homes(HashRing(members(8)))
    after = homes(HashRing(members(9)))
    moved = [k for k in KEYS if before[k] != after[k]]
    assert {after[k] for k in moved} == {"r8"}
    assert abs(len(moved) / len(KEYS) - 1 / 9) < 0.04


@pytest.mark.parametrize("n", [4, 8, 16])
def test_keys_spread_evenly_with_160_vnodes(n: int) -> None:
    counts = Counter(homes(HashRing(members(n))).values())
    assert len(counts) == n
    mean = len(KEYS) / n
    assert max(counts.values()) / mean < 1.3
    assert min(counts.values()) / mean > 0.7


def test_weight_two_gets_about_twice_the_keys() -> None:
    counts = Counter(homes(HashRing(members(4, r0=2))).values())
    share = counts["r0"] / len(KEYS)
    assert abs(share - 2 / 5) < 0.06


def test_fewer_vnodes_balance_worse_than_160() -> None:
    def spread(vnodes: int) -> float:
        counts = Counter(homes(HashRing(members(8), vnodes=vnodes)).values())
        return max(counts.values()) / (len(KEYS) / 8)

    assert spread(160) < spread(1)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(
            lambda: HashRing([RingMember("a"), RingMember("a")]), "duplicate", id="duplicate-names"
        ),
        pytest.param(lambda: RingMember("a", weight=0), "weight", id="zero-weight"),
        pytest.param(lambda: RingMember(""), "empty name", id="empty-name"),
        pytest.param(lambda: HashRing([RingMember("a")], vnodes=0), "vnodes", id="zero-vnodes"),
        pytest.param(
            lambda: build_ring("maglev", [RingMember("a")]), "xxhash, nginx", id="unknown-kind"
        ),
    ],
)
def test_invalid_rings_are_rejected(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_build_ring_kinds_honour_the_walk_contract() -> None:
    ms = members(5)
    for kind in ("xxhash", "nginx"):
        ring = build_ring(kind, ms)
        assert {m.name for m in ring.members} == {m.name for m in ms}
        for k in KEYS[:100]:
            assert sorted(ring.walk(k)) == sorted(m.name for m in ms)
    assert isinstance(build_ring("xxhash", ms, vnodes=40), HashRing)
