# ruff: noqa: F811  (fixtures imported from tests/integration/conftest.py)
from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest

from loadtest._net import quiet_port
from router.app import RouterApp, create_app
from router.settings import Settings
from tests.conftest import ThreadedServer
from tests.integration.conftest import fake_fleet, router_server, router_settings  # noqa: F401

SYSTEM = "You are a meticulous assistant for the billing team. Answer in two sentences at most."
CHAT = {"model": "fake-model",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}


def post(url: str, body: bytes | dict[str, Any], path: str = "/v1/chat/completions",
         **headers: str) -> httpx.Response:
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    return httpx.post(url + path, content=body,
                      headers={"content-type": "application/json", **headers})


@pytest.mark.parametrize(("path", "body", "ctype", "code"), [
    # one case per validation rule; the fake replica must never see any of them
    ("/v1/chat/completions", b"{not json", "application/json", "invalid_json"),
    ("/v1/chat/completions", b"", "application/json", "invalid_json"),
    ("/v1/chat/completions", b"\xff\xfe", "application/json", "invalid_json"),
    ("/v1/chat/completions", b"[1, 2]", "application/json", "invalid_body"),
    ("/v1/chat/completions", b'"text"', "application/json", "invalid_body"),
    ("/v1/chat/completions", b'{"model": "m"}', "application/json", "missing_field"),
    ("/v1/chat/completions", b'{"messages": "hi"}', "application/json", "invalid_type"),
    ("/v1/chat/completions", b'{"messages": []}', "application/json", "invalid_type"),
    ("/v1/chat/completions", b'{"messages": ["hi"]}', "application/json", "invalid_type"),
    ("/v1/chat/completions", b'{"messages": [{}], "model": 3}', "application/json", "invalid_type"),
    ("/v1/chat/completions", b'{"messages": [{}], "stream": "yes"}', "application/json", "invalid_type"),
    ("/v1/chat/completions", b'{"messages": [{}]}', "text/plain", "invalid_content_type"),
    ("/v1/chat/completions", b"messages=1", "application/x-www-form-urlencoded", "invalid_content_type"),
    ("/v1/completions", b'{"model": "m"}', "application/json", "missing_field"),
    ("/v1/completions", b'{"prompt": 5}', "application/json", "invalid_type"),
    ("/v1/embeddings", b'{"input": {"a": 1}}', "application/json", "invalid_type"),
])
def test_bad_requests_are_400(fake_fleet: Any, router_server: Any, path: str, body: bytes,
                              ctype: str, code: str) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls))
    r = httpx.post(srv.url + path, content=body, headers={"content-type": ctype})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == code and err["message"]
    assert fleet.counts() == {"r0": 0}


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"model": "fake-model", "prompt": "Once upon a time"}),
    ("/v1/completions", {"model": "fake-model", "prompt": [1, 2, 3]}),
    ("/v1/embeddings", {"model": "fake-model", "input": ["a", "b"]}),
    ("/v1/chat/completions", CHAT),
])
def test_valid_requests_reach_a_replica(fake_fleet: Any, router_server: Any, path: str,
                                        body: dict[str, Any]) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls))
    assert post(srv.url, body, path).status_code == 200
    assert fleet.replicas[0].requests[-1].path == path


def test_body_limit_413_by_header_and_by_stream(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls, proxy={"max_body_bytes": 1000}))
    big = json.dumps({**CHAT, "pad": "x" * 2000}).encode()
    r = post(srv.url, big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks() -> Any:  # no Content-Length: chunked upload, caught by the running size
        for i in range(0, len(big), 100):
            yield big[i:i + 100]

    r = httpx.post(srv.url + "/v1/chat/completions", content=chunks(),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert post(srv.url, CHAT).status_code == 200  # under the limit still fine
    assert fleet.counts() == {"r0": 1}


def test_max_in_flight_429_with_retry_after(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls, proxy={"max_in_flight": 2}))
    slow: list[int] = []

    def hold() -> None:
        slow.append(post(srv.url, CHAT, **{"x-fake-delay": "1.5"}).status_code)

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while fleet.replicas[0].running < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    r = post(srv.url, CHAT)
    for t in threads:
        t.join()
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert slow == [200, 200]
    assert post(srv.url, CHAT).status_code == 200  # slots are given back
    assert 'prefix_router_rejected_total{reason="overloaded"} 1.0' in \
        httpx.get(srv.url + "/metrics").text


def test_all_replicas_down_503_with_retry_after(router_server: Any) -> None:
    dead = [f"http://127.0.0.1:{quiet_port()}" for _ in range(2)]
    srv, _ = router_server(router_settings(dead, health={"interval": 60, "eject_after": 10}))
    r = post(srv.url, CHAT)
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "no_replica_available"


def test_auth(fake_fleet: Any, router_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_ROUTER_KEYS", "env-key-1,env-key-2")
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(
        fleet.urls, auth={"api_keys": ["file-key"], "api_keys_env": "TEST_ROUTER_KEYS"}))
    for headers, status in [({}, 401), ({"authorization": "Bearer nope"}, 401),
                            ({"authorization": "Basic file-key"}, 401),
                            ({"authorization": "Bearer file-key"}, 200),
                            ({"authorization": "bearer env-key-2"}, 200)]:
        r = post(srv.url, CHAT, **headers)
        assert r.status_code == status, headers
        if status == 401:
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert "nope" not in r.text
    assert httpx.get(srv.url + "/v1/models").status_code == 401
    # the router's own probes stay open
    assert httpx.get(srv.url + "/health").status_code == 200
    assert httpx.get(srv.url + "/ready").status_code == 200
    # client Authorization is forwarded unchanged when no upstream key is configured
    assert fleet.replicas[0].requests[-1].headers["authorization"] == "bearer env-key-2"


def test_models_union_from_healthy_replicas(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(3)
    srv, app = router_server(router_settings(fleet.urls))
    ids = [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]
    assert sorted(ids) == ["fake-model", "r0-only", "r1-only", "r2-only"]  # deduplicated
    r2 = app.replicas.get("r2")
    assert r2 is not None
    r2.draining = True
    ids = [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]
    assert "r2-only" not in ids and "fake-model" in ids


def test_ready_flips_with_replica_health(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls, health={"eject_after": 1}))
    assert httpx.get(srv.url + "/ready").status_code == 200
    fleet.replicas[0].healthy = False
    deadline = time.monotonic() + 10
    while httpx.get(srv.url + "/ready").status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    r = httpx.get(srv.url + "/ready")
    assert r.status_code == 503
    assert httpx.get(srv.url + "/health").status_code == 200  # alive regardless
    assert post(srv.url, CHAT).status_code == 503
    fleet.replicas[0].healthy = True
    deadline = time.monotonic() + 10
    while httpx.get(srv.url + "/ready").status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(srv.url + "/ready").status_code == 200
    assert post(srv.url, CHAT).status_code == 200


def test_not_found_and_other_v1_paths(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls))
    r = httpx.get(srv.url + "/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    # any other /v1/* path and method is proxied as-is
    r = httpx.request("DELETE", srv.url + "/v1/files/abc?purpose=x")
    assert r.status_code == 200
    seen = fleet.replicas[0].requests[-1]
    assert (seen.method, seen.path) == ("DELETE", "/v1/files/abc")


def test_admin_listener_serves_metrics(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(1)
    admin_port = quiet_port()
    srv, _ = router_server(router_settings(fleet.urls,
                                           admin={"host": "127.0.0.1", "port": admin_port}))
    assert post(srv.url, CHAT).status_code == 200
    assert httpx.get(srv.url + "/metrics").status_code == 404  # not on the public port
    r = httpx.get(f"http://127.0.0.1:{admin_port}/metrics")
    assert r.status_code == 200 and "prefix_router_requests_total" in r.text
    assert httpx.get(f"http://127.0.0.1:{admin_port}/ready").status_code == 200


def test_access_log_has_no_prompt_or_token(fake_fleet: Any, router_server: Any,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls, logging={"access_log": True}))
    capsys.readouterr()
    assert post(srv.url, CHAT, authorization="Bearer tok-123").status_code == 200
    out = ""
    deadline = time.monotonic() + 5  # the app flushes once a second
    while '"path"' not in out and time.monotonic() < deadline:
        time.sleep(0.05)
        out += capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, out
    rec = json.loads(lines[0])
    assert rec["status"] == 200 and rec["replica"] == "r0" and rec["path"] == "/v1/chat/completions"
    assert rec["branch"] == "home" and rec["key_source"] == "prefix"
    assert rec["bytes_in"] > 0 and rec["bytes_out"] > 0 and rec["duration_ms"] >= rec["ttfb_ms"]
    assert "billing" not in out and "tok-123" not in out


def test_app_construction_starts_nothing() -> None:
    app = RouterApp(Settings.from_dict({"replicas": [{"name": "r0", "url": "http://h:1"}]}))
    assert app.forwarder is None and not app.replicas.states()

    async def count() -> int:
        create_app(Settings())
        return len(asyncio.all_tasks())

    assert asyncio.run(count()) == 1  # only the test's own task


def test_lifespan_stops_background_tasks(fake_fleet: Any) -> None:
    fleet = fake_fleet(1)
    app = create_app(router_settings(fleet.urls))
    srv = ThreadedServer(app).start()
    tasks = list(app._tasks)
    assert {t.get_name() for t in tasks} == {"discovery", "probes", "scrape"}
    srv.stop()
    assert all(t.done() for t in tasks) and app._session is None


def test_the_default_policy_is_the_cache_aware_pipeline() -> None:
    base = {"replicas": [{"name": "r0", "url": "http://h:1"}]}
    app = RouterApp(Settings.from_dict(base))
    assert app.router.pipeline is not None and app.router.index is not None
    assert app.policy is None
    # prompt_affinity is still accepted; the hash-only prefix policy keeps no tables
    prefix = RouterApp(Settings.from_dict({**base, "routing": {"policy": "prefix",
                                                               "prompt_affinity": False}}))
    assert prefix.policy is not None and prefix.router.index is None
