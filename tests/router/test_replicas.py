"""Replica registry: load estimate, availability, membership updates that keep state."""

from __future__ import annotations

import pytest

from router.discovery import Endpoint
from router.replicas import ReplicaSet, ReplicaState, address_of
from router.ring import HashRing


def eps(*names: str, weight: int = 1) -> list[Endpoint]:
    return [Endpoint(n, f"http://10.0.0.{i}:8000", weight) for i, n in enumerate(names)]


# (in_flight, running, waiting, load) - one case per line
# fmt: off
LOADS = [
    pytest.param(3, 0.0, 0.0, 3.0, id="idle-scrape-uses-local-in-flight"),
    pytest.param(1, 5.0, 2.0, 7.0, id="scraped-queue-wins-when-larger"),
    pytest.param(9, 5.0, 2.0, 9.0, id="local-in-flight-wins-when-larger"),
    pytest.param(0, 0.0, 0.0, 0.0, id="idle"),
]
# fmt: on


@pytest.mark.parametrize(("in_flight", "running", "waiting", "load"), LOADS)
def test_load_is_the_larger_of_local_and_scraped(
    in_flight: int, running: float, waiting: float, load: float
) -> None:
    state = ReplicaState("r", "http://x:1", in_flight=in_flight, running=running, waiting=waiting)
    assert state.load() == load


@pytest.mark.parametrize(
    ("healthy", "draining", "available"),
    [(True, False, True), (False, False, False), (True, True, False), (False, True, False)],
)
def test_available_means_healthy_and_not_draining(
    healthy: bool, draining: bool, available: bool
) -> None:
    assert ReplicaState("r", "u", healthy=healthy, draining=draining).available is available


def test_replica_weight_must_be_positive() -> None:
    with pytest.raises(ValueError, match="weight"):
        ReplicaState("r", "http://x:1", weight=0)


def test_states_sorted_by_name_and_lookup() -> None:
    rs = ReplicaSet(eps("b", "c", "a"))
    assert [s.name for s in rs.states()] == ["a", "b", "c"]
    assert len(rs) == 3 and "a" in rs and "z" not in rs
    assert rs.get("z") is None
    assert sorted(rs.ring.walk("k")) == ["a", "b", "c"]


def test_update_keeps_survivor_state_and_drops_departed() -> None:
    rs = ReplicaSet(eps("a", "b", "c"))
    a = rs.get("a")
    assert a is not None
    a.in_flight, a.healthy, a.running = 4, False, 2.0
    assert rs.update_membership(eps("a", "c", "d")) is True
    survivor = rs.get("a")
    assert survivor is a and (a.in_flight, a.healthy, a.running) == (4, False, 2.0)
    assert rs.get("b") is None
    new = rs.get("d")
    assert new is not None and new.available and new.in_flight == 0
    assert sorted(rs.ring.walk("k")) == ["a", "c", "d"]


def test_a_new_url_forgets_when_the_load_was_last_scraped() -> None:
    # another process at a new address: the old scraped load is not kept through its failures
    rs = ReplicaSet(eps("a", "b"))
    a, b = rs.get("a"), rs.get("b")
    assert a is not None and b is not None
    a.scraped_at = b.scraped_at = 5.0
    rs.update_membership([Endpoint("a", "http://10.9.9.9:8000"), eps("a", "b")[1]])
    assert (a.url, a.scraped_at) == ("http://10.9.9.9:8000", None)
    assert b.scraped_at == 5.0  # same address: kept


def test_unchanged_membership_keeps_the_same_ring_object() -> None:
    rs = ReplicaSet(eps("a", "b"))
    ring = rs.ring
    assert rs.update_membership(list(reversed(eps("a", "b")))) is False
    assert rs.ring is ring


def test_weight_change_rebuilds_the_ring() -> None:
    rs = ReplicaSet(eps("a", "b"))
    ring = rs.ring
    assert rs.update_membership(eps("a", "b", weight=2)) is True
    assert rs.ring is not ring
    assert {m.weight for m in rs.ring.members} == {2}
    state = rs.get("a")
    assert state is not None and state.weight == 2


def test_ring_stays_over_unready_and_terminating_replicas() -> None:
    rs = ReplicaSet(eps("a", "b", "c"))
    ring = rs.ring
    rs.update_membership(
        [
            Endpoint("a", "http://10.0.0.0:8000"),
            Endpoint("b", "http://10.0.0.1:8000", ready=False),
            Endpoint("c", "http://10.0.0.2:8000", terminating=True),
        ]
    )
    assert rs.ring is ring  # their keys come back to them when they return
    draining = {s.name: s.draining for s in rs.states()}
    assert draining == {"a": False, "b": True, "c": True}
    rs.update_membership(eps("a", "b", "c"))
    assert not any(s.draining for s in rs.states())


def test_invalid_membership_changes_nothing() -> None:
    rs = ReplicaSet(eps("a", "b"))
    ring, states = rs.ring, rs.states()
    with pytest.raises(ValueError, match="duplicate"):
        rs.update_membership([*eps("a", "b"), Endpoint("a", "http://10.9.9.9:1")])
    with pytest.raises(ValueError, match="weight"):
        rs.update_membership(eps("a", "b", weight=0))
    assert rs.ring is ring and rs.states() == states
    state = rs.get("a")
    assert state is not None and state.weight == 1


def test_empty_membership_and_ring_kinds() -> None:
    rs = ReplicaSet()
    assert rs.states() == () and list(rs.ring.walk("k")) == []
    nginx = ReplicaSet(eps("a", "b"), ring_kind="nginx")
    assert not isinstance(nginx.ring, HashRing)
    assert {m.address for m in nginx.ring.members} == {"10.0.0.0:8000", "10.0.0.1:8000"}
    with pytest.raises(ValueError, match="ring kind"):
        ReplicaSet(ring_kind="maglev")


# fmt: off
ADDRESSES = [
    pytest.param("http://10.0.0.7:8000", "10.0.0.7:8000", id="explicit-port"),
    pytest.param("http://vllm-0.vllm:8000/", "vllm-0.vllm:8000", id="hostname-trailing-slash"),
    pytest.param("http://10.0.0.7", "10.0.0.7:80", id="http-default-port"),
    pytest.param("https://gpu.example", "gpu.example:443", id="https-default-port"),
    pytest.param("http://[fd00::7]:8000", "[fd00::7]:8000", id="ipv6-bracketed"),
]
# fmt: on


@pytest.mark.parametrize(("url", "address"), ADDRESSES)
def test_address_of_url(url: str, address: str) -> None:
    assert address_of(url) == address
