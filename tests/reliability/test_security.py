"""Security: client auth, Authorization forwarding, the admin listener, secrets in logs and
metrics, label cardinality, and the simulated replica's loopback-only fault endpoint.

Upstreams here are a recording ASGI app (`Recorder`) on 127.0.0.1 that keeps the headers of
every request it receives, so a test sees exactly what the router sent on.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from loadtest._net import quiet_port
from loadtest.fleet import Fleet
from loadtest.replica import Replica, ReplicaConfig
from router import auth as router_auth
from tests.conftest import ThreadedServer, asgi_lifespan
from tests.reliability.conftest import RouterProcess, parse_metrics, router_config
from tests.reliability.load import chat_body

CANARY = "canary-7f3a9c-do-not-log"


class Recorder:
    """An upstream that answers every request 200 (SSE when asked to stream) and records the
    request headers; a prompt containing 'please-fail' gets a 500 carrying the prompt back."""

    def __init__(self) -> None:
        self.headers: list[list[tuple[bytes, bytes]]] = []
        self.probes: list[list[tuple[bytes, bytes]]] = []  # the router's GET /v1/models
        self.lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await asgi_lifespan(receive, send)
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        if scope["path"].startswith("/v1/"):
            with self.lock:
                (self.probes if scope["method"] == "GET" else self.headers).append(
                    list(scope["headers"]))
        status, ctype = 200, b"application/json"
        out = b'{"id":"r","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}'
        if b"please-fail" in body:
            status, out = 500, body
        elif b'"stream": true' in body:
            ctype = b"text/event-stream"
            out = b'data: {"choices":[{"delta":{"content":"ok"}}]}\n\ndata: [DONE]\n\n'
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype)]})
        await send({"type": "http.response.body", "body": out})

    def authorization(self) -> list[list[bytes]]:
        return [[v for n, v in h if n == b"authorization"] for h in self.headers]


@pytest.fixture
def recorder() -> Iterator[tuple[Recorder, ThreadedServer]]:
    rec = Recorder()
    srv = ThreadedServer(rec).start()
    yield rec, srv
    srv.stop()


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None,
         path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(url + path, json=body, headers=headers or {}, timeout=10)


def openai_error(resp: httpx.Response) -> dict[str, Any]:
    err = resp.json()["error"]
    assert {"message", "type", "code"} <= set(err)
    return dict(err)


# -- client authentication ---------------------------------------------------------------------
AUTH_CASES = [
    # (Authorization header or None, expected status) - what each row proves
    (None, 401),                          # no credentials
    ("Bearer wrong", 401),                # unknown key
    ("Bearer key-one", 200),              # key from auth.api_keys
    ("bearer key-three", 200),            # key from auth.api_keys_env; scheme is case-insensitive
    ("Basic key-one", 401),               # right secret, wrong scheme
    ("Bearer key-one-extra", 401),        # a known key as a prefix is not enough
    ("Bearer key-on", 401),               # a prefix of a known key is not enough
    ("Bearer", 401),                      # scheme without a token
    ("key-one", 401),                     # bare key without a scheme
]


def test_client_auth(recorder: tuple[Recorder, ThreadedServer],
                     start_router: Callable[..., RouterProcess]) -> None:
    _, upstream = recorder
    router = start_router(router_config([upstream.url], ["rec"],
                                        auth={"api_keys": ["key-one"],
                                              "api_keys_env": "RELIABILITY_CLIENT_KEYS"}),
                          env={"RELIABILITY_CLIENT_KEYS": "key-two, key-three"})
    for header, want in AUTH_CASES:
        resp = post(router.url, chat_body(1), {"Authorization": header} if header else None)
        assert resp.status_code == want, (header, resp.status_code)
        if want == 401:
            err = openai_error(resp)
            assert err["code"] == "invalid_api_key" and "key-one" not in resp.text
    for path in ("/health", "/ready"):   # probes never need a key
        assert httpx.get(router.url + path).status_code == 200


def test_auth_compares_in_constant_time() -> None:
    """The key check uses hmac.compare_digest, compares every key (no early exit), and never
    compares the presented token with ==, != or `in`."""
    tree = ast.parse(inspect.getsource(router_auth))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "compare_digest"]
    assert calls, "hmac.compare_digest is not used"
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            ops = {type(op) for op in node.ops}
            assert not ({"token", "key", "keys"} & names and
                        ops & {ast.Eq, ast.NotEq, ast.In, ast.NotIn}), ast.unparse(node)
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.For)
             and any(c in ast.walk(n) for c in calls)]
    assert loops, "compare_digest is not applied to each configured key"
    for loop in loops:
        assert not any(isinstance(n, ast.Break | ast.Return) for n in ast.walk(loop))


# -- Authorization towards the replicas --------------------------------------------------------
def test_client_authorization_forwarded_unchanged(
        recorder: tuple[Recorder, ThreadedServer],
        start_router: Callable[..., RouterProcess]) -> None:
    rec, upstream = recorder
    router = start_router(router_config([upstream.url], ["rec"]))
    token = "Bearer sk-client-Secret_123 with spaces"
    assert post(router.url, chat_body(2), {"Authorization": token}).status_code == 200
    assert post(router.url, chat_body(3, stream=True),
                {"Authorization": token}).status_code == 200
    assert rec.authorization() == [[token.encode()]] * 2


def test_upstream_key_replaces_client_key(recorder: tuple[Recorder, ThreadedServer],
                                          start_router: Callable[..., RouterProcess]) -> None:
    rec, upstream = recorder
    router = start_router(router_config([upstream.url], ["rec"],
                                        auth={"api_keys": ["client-key"],
                                              "upstream_api_key_env": "RELIABILITY_UPSTREAM"}),
                          env={"RELIABILITY_UPSTREAM": "upstream-secret"})
    for stream in (False, True):
        resp = post(router.url, chat_body(4, stream=stream),
                    {"Authorization": "Bearer client-key"})
        assert resp.status_code == 200
    assert rec.authorization() == [[b"Bearer upstream-secret"]] * 2
    assert not any(b"client-key" in v for h in rec.headers for _, v in h)


# -- /metrics on the admin listener --------------------------------------------------------------
def test_metrics_only_on_admin_listener(recorder: tuple[Recorder, ThreadedServer],
                                        start_router: Callable[..., RouterProcess]) -> None:
    _, upstream = recorder
    router = start_router(router_config([upstream.url], ["rec"],
                                        admin={"host": "127.0.0.1", "port": quiet_port()}))
    assert post(router.url, chat_body(5)).status_code == 200
    assert httpx.get(router.url + "/metrics").status_code == 404
    admin = f"http://127.0.0.1:{router.config['admin']['port']}"
    resp = httpx.get(admin + "/metrics")
    assert resp.status_code == 200 and "prefix_router_requests_total" in resp.text
    # the admin listener serves metrics and probes, never the API
    assert httpx.post(admin + "/v1/chat/completions", json=chat_body(5)).status_code == 404


# -- no secrets in logs or metrics ---------------------------------------------------------------
def test_no_prompt_or_key_in_logs_or_metrics(recorder: tuple[Recorder, ThreadedServer],
                                             start_router: Callable[..., RouterProcess],
                                             measure: Callable[..., None]) -> None:
    _, upstream = recorder
    key = f"sk-{CANARY}"
    router = start_router(router_config([upstream.url], ["rec"],
                                        auth={"api_keys": [key]},
                                        logging={"level": "debug", "access_log": True}))
    good = {"Authorization": f"Bearer {key}", "X-Session-ID": CANARY}
    canary_body = chat_body(6, f"my secret is {CANARY}")
    canary_body["user"] = CANARY
    sent = [
        post(router.url, canary_body, good).status_code,                               # 200
        post(router.url, {**canary_body, "stream": True}, good).status_code,           # 200 SSE
        post(router.url, canary_body, {"Authorization": f"Bearer {CANARY}-wrong"}).status_code,
        post(router.url, canary_body, {"Authorization": f"Basic {CANARY}"}).status_code,
        httpx.post(router.url + "/v1/chat/completions", headers=good,
                   content=f'{{"messages": "{CANARY}'.encode()).status_code,          # 400
        post(router.url, {"messages": CANARY}, good).status_code,                      # 400
        post(router.url, chat_body(7, f"please-fail {CANARY}"), good).status_code,     # 500 relayed
        post(router.url, canary_body, good, path=f"/v1/chat/completions?q={CANARY}").status_code,
        post(router.url, canary_body, {**good, "Content-Type": f"text/{CANARY}"}).status_code,
    ]
    assert sent == [200, 200, 401, 401, 400, 400, 500, 200, 400]
    metrics_text = httpx.get(router.metrics_url).text
    router.stop()   # flushes the buffered access log
    output = router.output()
    access_lines = [line for line in output.splitlines() if line.startswith("{")]
    measure("security_logs", requests=len(sent), access_log_lines=len(access_lines),
            log_bytes=len(output), canary_in_logs=output.count(CANARY),
            canary_in_metrics=metrics_text.count(CANARY))
    assert len(access_lines) >= 7   # the access log was on and captured
    assert CANARY not in output
    assert CANARY not in metrics_text


def series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(n, tuple(sorted(lab.items()))) for n, lab, _ in parse_metrics(text)}


def test_label_cardinality_is_bounded(recorder: tuple[Recorder, ThreadedServer],
                                      start_router: Callable[..., RouterProcess],
                                      measure: Callable[..., None]) -> None:
    _, upstream = recorder
    router = start_router(router_config([upstream.url], ["rec"]))

    async def traffic(start: int, n: int) -> None:
        async with httpx.AsyncClient(timeout=10) as c:
            for i in range(start, start + n):
                body = chat_body(i, f"user question {i}", stream=i % 2 == 0)
                body["user"] = f"user-{i}"
                headers = {"X-Session-ID": f"session-{i}"}
                if i % 3 == 0:
                    headers["X-Prefix-Hash"] = f"hash-{i}"
                path = "/v1/chat/completions" if i % 5 else f"/v1/custom-{i}/chat/completions"
                r = await c.post(router.url + path, json=body, headers=headers)
                assert r.status_code == 200
                await c.post(router.url + "/v1/chat/completions", content=b"{bad",
                             headers={"content-type": "application/json"})

    asyncio.run(traffic(0, 20))   # every kind of request once: all label values exist now
    before = series(httpx.get(router.metrics_url).text)
    asyncio.run(traffic(20, 500))
    text = httpx.get(router.metrics_url).text
    after = series(text)
    measure("security_cardinality", distinct_keys_users_sessions=500,
            series_before=len(before), series_after=len(after))
    assert after == before
    assert "user-2" not in text and "session-2" not in text and "hash-2" not in text


# -- the simulated replica's admin endpoint is loopback-only ----------------------------------
async def asgi_call(app: Any, method: str, path: str, client: tuple[str, int],
                    body: bytes = b"") -> int:
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [(b"content-type", b"application/json")],
             "client": client, "server": ("127.0.0.1", 8000), "scheme": "http",
             "http_version": "1.1"}
    await app(scope, receive, send)
    return int(next(m for m in sent if m["type"] == "http.response.start")["status"])


@pytest.mark.parametrize("peer, want", [
    (("203.0.113.7", 40000), 403),      # a remote peer
    (("192.0.2.2", 40000), 403),        # this host's own non-loopback address
    (("::ffff:203.0.113.7", 40000), 403),
    (("127.0.0.1", 40000), 200),
    (("::1", 40000), 200),
])
def test_replica_admin_checks_the_peer(peer: tuple[str, int], want: int) -> None:
    app = Replica(ReplicaConfig(instant=True))
    assert asyncio.run(asgi_call(app, "POST", "/admin/fault", peer,
                                 b'{"error_rate": 1.0}')) == want
    assert (app.faults.spec.error_rate == 1.0) is (want == 200)


def raw_get(port: int, path: str, source: str, extra: bytes = b"") -> int:
    with socket.socket() as s:
        s.bind((source, 0))
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
                  + extra + b"\r\n")
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_replica_admin_over_the_network(start_fleet: Callable[..., Fleet]) -> None:
    """A peer address other than 127.0.0.1 (127.0.0.2: still on lo, so nothing leaves the
    host) is refused, on the main and the admin port, even with a forged X-Forwarded-For."""
    fleet = start_fleet(1, instant=True)
    main_port = fleet.ports[0]
    admin_port = int(fleet.admin_urls[0].rsplit(":", 1)[1])
    for port in (main_port, admin_port):
        assert raw_get(port, "/admin/stats", "127.0.0.1") == 200
        assert raw_get(port, "/admin/stats", "127.0.0.2") == 403
        assert raw_get(port, "/admin/stats", "127.0.0.2",
                       b"X-Forwarded-For: 127.0.0.1\r\nX-Real-IP: 127.0.0.1\r\n") == 403


def test_router_does_not_reach_replica_admin(start_fleet: Callable[..., Fleet],
                                             start_router: Callable[..., RouterProcess]) -> None:
    """The router talks to replicas from 127.0.0.1, so a path that reached /admin/* through it
    would let any client inject faults; only /v1/* is proxied and is sent on verbatim."""
    fleet = start_fleet(1, instant=True)
    router = start_router(router_config(fleet.urls, fleet.names))
    spec = json.dumps({"error_rate": 1.0}).encode()
    for path in ("/admin/fault", "/v1/../admin/fault", "/v1/%2e%2e/admin/fault",
                 "/v1/..%2fadmin/fault", "//admin/fault", "/v1/./../admin/fault"):
        with socket.create_connection(("127.0.0.1", router.port), timeout=5) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(spec)}\r\nConnection: close\r\n\r\n".encode() + spec)
            status = int(s.recv(4096).split(b" ", 2)[1])
        assert status != 200, path
        assert fleet.stats(0)["faults"]["error_rate"] == 0.0, path



def test_model_probes_carry_the_upstream_key(recorder: tuple[Recorder, ThreadedServer],
                                             start_router: Callable[..., RouterProcess]) -> None:
    # vLLM --api-key guards /v1/models too: the router's probes authenticate like its requests
    rec, upstream = recorder
    start_router(router_config([upstream.url], ["rec"],
                               auth={"upstream_api_key_env": "RELIABILITY_UPSTREAM"}),
                 env={"RELIABILITY_UPSTREAM": "upstream-secret"})
    deadline = time.monotonic() + 10
    while not rec.probes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rec.probes, "no /v1/models probe reached the upstream"
    assert dict(rec.probes[0]).get(b"authorization") == b"Bearer upstream-secret"
