"""NginxRing against placements captured from a real nginx, plus pure ring properties.

The reference table is not typed in: a session fixture starts nginx with the generated config in
front of self-naming upstreams, sends every key and records where nginx sent it.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.replicas import address_of
from router.ring import RingMember, build_ring
from router.ring.nginx import NGINX_MAX_SKIPS, POINTS_PER_WEIGHT, NginxRing, split_server
from tests.nginx.harness import Replica, nginx_fleet, placements, running_nginx

WEIGHTS = (3, 1, 2, 1, 1)  # uneven on purpose: weight changes the number of points
TABLE_KEYS = (
    [f"key-{i}" for i in range(600)]
    # the shape hash_key produces (hex digests) and a few odd ones
    + [hashlib.sha256(str(i).encode()).hexdigest() for i in range(300)]
    + ["a", "ü-ñ-ß", "x" * 4000, "with space", "0", "\N{SNOWMAN}"]
)


def members_of(replicas: list[Replica]) -> list[RingMember]:
    return [RingMember(name, weight, address_of(url)) for name, url, weight in replicas]


@pytest.fixture(scope="session")
def captured(
        tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[Replica], dict[str, str]]]:
    """(replicas, {key: replica nginx chose}) recorded from a real nginx."""
    tmp: Path = tmp_path_factory.mktemp("nginx-table")
    with nginx_fleet(tmp / "backends", WEIGHTS) as replicas, \
            running_nginx(tmp / "front", replicas) as nginx:
        yield replicas, placements(nginx.port, TABLE_KEYS)


@pytest.mark.nginx
def test_lookup_matches_placements_captured_from_nginx(
        captured: tuple[list[Replica], dict[str, str]]) -> None:
    replicas, table = captured
    ring = NginxRing(members_of(replicas))
    mismatched = {k: (table[k], ring.lookup(k)) for k in table if ring.lookup(k) != table[k]}
    assert mismatched == {}
    assert set(table.values()) == {name for name, _, _ in replicas}  # every replica was exercised


@pytest.mark.nginx
def test_captured_table_agrees_with_build_ring_walk(
        captured: tuple[list[Replica], dict[str, str]]) -> None:
    replicas, table = captured
    ring = build_ring("nginx", members_of(replicas))
    assert isinstance(ring, NginxRing)
    assert all(next(ring.walk(k)) == name for k, name in table.items())


def ring_of(n: int, weights: tuple[int, ...] | None = None) -> NginxRing:
    weights = weights or (1,) * n
    return NginxRing([RingMember(f"r{i}", w, f"10.0.0.{i}:8000") for i, w in enumerate(weights)])


KEYS = [f"k{i}" for i in range(5000)]


def test_removing_a_member_moves_only_its_keys() -> None:
    before = ring_of(5)
    after = NginxRing([m for m in before.members if m.name != "r2"])
    for key in KEYS:
        old, new = before.lookup(key), after.lookup(key)
        if old != "r2":
            assert new == old, key
        else:
            # the key moves to the next server along the old ring: nginx's own failover target
            assert new == list(before.walk(key))[1], key
    assert sum(before.lookup(k) == "r2" for k in KEYS) > 0


def test_adding_a_member_moves_keys_only_onto_it() -> None:
    before, after = ring_of(4), ring_of(5)
    moved = [k for k in KEYS if before.lookup(k) != after.lookup(k)]
    assert moved and all(after.lookup(k) == "r4" for k in moved)
    assert 0.1 < len(moved) / len(KEYS) < 0.3  # about 1/5 of the keys


def test_walk_yields_every_member_once_starting_at_home() -> None:
    ring = ring_of(6, (1, 2, 1, 3, 1, 1))
    for key in KEYS[:300]:
        order = list(ring.walk(key))
        assert order[0] == ring.lookup(key)
        assert sorted(order) == sorted(m.name for m in ring.members)


def test_points_per_weight_and_weight_share() -> None:
    ring = ring_of(3, (1, 2, 3))
    assert len(ring) == POINTS_PER_WEIGHT * 6  # no collisions in this ring
    share = {name: sum(ring.lookup(k) == name for k in KEYS) / len(KEYS) for name in ("r0", "r2")}
    assert share["r0"] < share["r2"]


def test_home_is_first_point_at_or_after_key_hash_and_wraps() -> None:
    ring = ring_of(3)
    hashes = ring._hashes  # white-box: the sorted, de-duplicated points
    assert hashes == sorted(set(hashes))
    for key in KEYS[:200]:
        h = zlib.crc32(key.encode())
        index = ring.home_point(key)
        assert hashes[index] >= h or (index == 0 and h > hashes[-1])
        assert index == 0 or hashes[index - 1] < h


@pytest.mark.parametrize(("server", "host", "port"), [
    ("127.0.0.1:8000", b"127.0.0.1", b"8000"),  # ordinary host:port
    ("[::1]:8000", b"[::1]", b"8000"),  # IPv6: only the last colon splits
    ("vllm-0.svc", b"vllm-0.svc", b""),  # no port
    ("host:", b"host", b""),  # empty digit run still splits at the colon
    ("unix:/run/v.sock", b"/run/v.sock", b""),  # unix socket: path is the host
    ("UNIX:/x", b"/x", b""),  # prefix matched case-insensitively
    ("a:b", b"a:b", b""),  # non-digit after colon: all host
])
def test_split_server_like_nginx(server: str, host: bytes, port: bytes) -> None:
    assert split_server(server) == (host, port)


def test_nginx_pick_follows_walk_within_the_skip_cap() -> None:
    ring = ring_of(4)
    for key in KEYS[:500]:
        order = list(ring.walk(key))
        assert ring.nginx_pick(key) == order[0]
        assert ring.nginx_pick(key, {order[0]}) == order[1]


def test_nginx_pick_gives_up_after_twenty_skipped_points() -> None:
    # A heavy member owns long runs of consecutive points; with it unavailable nginx gives up
    # (round-robin) whenever more than NGINX_MAX_SKIPS points in a row are its own.
    ring = ring_of(2, (60, 1))
    outcomes = {ring.nginx_pick(k, {"r0"}) for k in KEYS}
    assert outcomes == {"r1", None}
    for key in KEYS[:500]:
        start, total = ring.home_point(key), len(ring)
        run = 0
        while ring._owners[(start + run) % total] == 0:
            run += 1
        assert (ring.nginx_pick(key, {"r0"}) is None) == (run > NGINX_MAX_SKIPS)


def test_single_member_and_empty_ring() -> None:
    one = ring_of(1)
    assert one.lookup("x") == "r0" and list(one.walk("x")) == ["r0"]
    assert one.nginx_pick("x") == "r0" and one.nginx_pick("x", {"r0"}) is None
    empty = NginxRing([])
    assert list(empty.walk("x")) == [] and empty.home("x") is None


def test_rejects_duplicate_names_and_addresses() -> None:
    with pytest.raises(ValueError, match="names"):
        NginxRing([RingMember("a", 1, "h:1"), RingMember("a", 1, "h:2")])
    with pytest.raises(ValueError, match="addresses"):
        NginxRing([RingMember("a", 1, "h:1"), RingMember("b", 1, "h:1")])
