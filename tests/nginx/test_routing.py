"""The generated config on a real nginx: placement equals NginxRing, SSE streams, spreading,
failover along the ring, membership changes, and what is not proxied."""

from __future__ import annotations

import http.client
import json
from collections import Counter
from pathlib import Path

import pytest

from loadtest._net import quiet_port
from router.replicas import address_of
from tests.conftest import ThreadedServer
from tests.nginx.harness import (
    KEY_HEADER,
    NginxProcess,
    StreamGate,
    identity_app,
    identity_fleet,
    nginx_fleet,
    placements,
    render_standalone,
    ring_of,
    running_nginx,
)

pytestmark = pytest.mark.nginx

KEYS = [f"prefix-{i:05d}" for i in range(2000)]


def request(port: int, method: str, path: str, headers: dict[str, str] | None = None,
            body: bytes | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def test_2000_keys_land_where_nginx_ring_says_with_uneven_weights(tmp_path: Path) -> None:
    # Upstreams are starlette apps that name themselves in x-replica-name.
    with identity_fleet([1, 3, 2, 1]) as replicas, running_nginx(tmp_path, replicas) as nginx:
        got = placements(nginx.port, KEYS)
    ring = ring_of(replicas)
    assert {k: v for k, v in got.items() if ring.lookup(k) != v} == {}
    counts = Counter(got.values())
    assert counts["r1"] > counts["r0"] and counts["r1"] > counts["r3"]  # weight 3 vs 1


def test_2000_keys_land_where_nginx_ring_says_with_equal_weights(tmp_path: Path) -> None:
    with nginx_fleet(tmp_path / "backends", [1] * 6) as replicas, \
            running_nginx(tmp_path / "front", replicas) as nginx:
        got = placements(nginx.port, KEYS)
    ring = ring_of(replicas)
    assert {k: v for k, v in got.items() if ring.lookup(k) != v} == {}
    assert set(got.values()) == {name for name, _, _ in replicas}


def test_requests_without_the_header_spread_over_all_replicas(tmp_path: Path) -> None:
    n = 200
    with identity_fleet([1, 1, 1, 1]) as replicas, running_nginx(tmp_path, replicas) as nginx:
        seen: Counter[str] = Counter()
        for i in range(n):
            # absent and empty headers both count as "no key"
            headers = {KEY_HEADER: ""} if i % 2 else {}
            status, response_headers, body = request(nginx.port, "POST", "/v1/chat/completions",
                                                     headers, b"{}")
            assert status == 200
            seen[response_headers["x-replica-name"]] += 1
            assert json.loads(body)["key"] in (None, "")  # nginx does not invent a header
    assert set(seen) == {"r0", "r1", "r2", "r3"}
    # mean 50 per replica; 15 is more than 5 standard deviations below it
    assert min(seen.values()) >= 15, seen


def test_sse_chunks_reach_the_client_before_the_upstream_finishes(tmp_path: Path) -> None:
    gate = StreamGate()
    with ThreadedServer(identity_app("r0", gate)) as upstream, \
            running_nginx(tmp_path, [("r0", upstream.url, 1)]) as nginx:
        conn = http.client.HTTPConnection("127.0.0.1", nginx.port, timeout=10)
        try:
            conn.request("POST", "/v1/stream", body=b"{}", headers={KEY_HEADER: "k"})
            response = conn.getresponse()
            assert response.status == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["x-accel-buffering"] == "no"
            first = response.readline()
            # The upstream is still holding the rest of the stream: nothing was buffered.
            assert first == b'data: {"chunk": 0}\n'
            assert not gate.finished.is_set()
            gate.release.set()
            rest = response.read()
        finally:
            conn.close()
    assert gate.finished.is_set()
    assert b"gate-timeout" not in rest
    assert rest.count(b"data: ") == 4 and rest.rstrip().endswith(b"data: [DONE]")


def test_debug_headers_name_the_upstream(tmp_path: Path) -> None:
    with identity_fleet([1, 1]) as replicas, running_nginx(tmp_path, replicas) as nginx:
        status, headers, _ = request(nginx.port, "POST", "/v1/completions", {KEY_HEADER: "abc"},
                                     b"{}")
    by_name = {name: address_of(url) for name, url, _ in replicas}
    assert status == 200
    assert headers["x-prefix-router-replica"] == headers["x-replica-name"]
    assert headers["x-upstream-addr"] == by_name[headers["x-replica-name"]]


@pytest.mark.parametrize("path", ["/metrics", "/health", "/", "/v2/models"])
def test_router_and_other_endpoints_are_not_proxied(tmp_path: Path, path: str) -> None:
    with identity_fleet([1]) as replicas, running_nginx(tmp_path, replicas) as nginx:
        status, headers, _ = request(nginx.port, "GET", path)
    assert status == 404
    assert "x-replica-name" not in headers  # answered by nginx itself, no replica saw it


def test_keys_of_an_unreachable_replica_follow_the_ring_walk(tmp_path: Path) -> None:
    dead_port = quiet_port()  # nothing listens: connection refused, `proxy_next_upstream error`
    with nginx_fleet(tmp_path / "backends", [1, 1, 1]) as alive:
        replicas = [*alive, ("r3", f"http://127.0.0.1:{dead_port}", 1)]
        ring = ring_of(replicas)
        keys = KEYS[:600]
        with running_nginx(tmp_path / "front", replicas) as nginx:
            got = placements(nginx.port, keys)
    orphans = [k for k in keys if ring.lookup(k) == "r3"]
    assert len(orphans) > 50
    for key in keys:
        walk = list(ring.walk(key))
        expected = walk[1] if walk[0] == "r3" else walk[0]
        assert ring.nginx_pick(key, {"r3"}) == expected  # no 20-skip round-robin case here
        assert got[key] == expected, key


def test_reload_without_a_replica_moves_only_its_keys(tmp_path: Path) -> None:
    keys = KEYS[:1000]
    with nginx_fleet(tmp_path / "backends", [1, 2, 1, 1]) as replicas:
        port = quiet_port()
        nginx = NginxProcess(tmp_path / "front", render_standalone(replicas, port), port).start()
        try:
            before = placements(nginx.port, keys)
            remaining = [r for r in replicas if r[0] != "r1"]
            nginx.reload(render_standalone(remaining, port))
            after = placements(nginx.port, keys)
        finally:
            nginx.stop()
    old_ring, new_ring = ring_of(replicas), ring_of(remaining)
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == "r1"}
    assert all(after[k] == new_ring.lookup(k) == list(old_ring.walk(k))[1] for k in moved)
