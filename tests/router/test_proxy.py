# ruff: noqa: F811  (fixtures imported from tests/integration/conftest.py)
from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import aiohttp
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadtest._net import quiet_port
from router.app import RouterApp
from router.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout, translate_upstream
from router.proxy import HOP_BY_HOP, strip_hop_by_hop
from tests.integration.conftest import fake_fleet, router_server, router_settings  # noqa: F401

SYSTEM = "You are a meticulous assistant for the billing team. Answer in two sentences at most."


@pytest.mark.parametrize(("headers", "kept"), [
    # the fixed hop-by-hop set goes, end-to-end headers stay (names lowered)
    ([(b"Connection", b"keep-alive"), (b"Keep-Alive", b"timeout=5"), (b"TE", b"trailers"),
      (b"Transfer-Encoding", b"chunked"), (b"Upgrade", b"h2c"), (b"Trailer", b"x"),
      (b"Content-Type", b"application/json")], [(b"content-type", b"application/json")]),
    # headers named in Connection go too, case-insensitively
    ([(b"connection", b"close, X-Secret-Hop"), (b"x-secret-hop", b"1"), (b"x-keep", b"2")],
     [(b"x-keep", b"2")]),
    # every proxy-* header goes
    ([(b"proxy-authorization", b"Basic x"), (b"proxy-connection", b"keep-alive"),
      (b"authorization", b"Bearer k")], [(b"authorization", b"Bearer k")]),
    # repeated end-to-end headers keep their order
    ([(b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")],
     [(b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")]),
])
def test_strip_hop_by_hop(headers: list[tuple[bytes, bytes]],
                          kept: list[tuple[bytes, bytes]]) -> None:
    assert strip_hop_by_hop(headers) == kept


def key_homed_on(app: RouterApp, replica: str) -> str:
    """An X-Prefix-Hash value whose ring walk starts at `replica`."""
    for i in range(10_000):
        key = f"k{i}"
        if next(iter(app.replicas.ring.walk(key))) == replica:
            return key
    raise AssertionError("no key found")


def chat(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "stream": stream, **extra,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}


def dead_url() -> str:
    return f"http://127.0.0.1:{quiet_port()}"  # nothing listens there


def test_connect_failure_retries_next_candidate(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(2, names=["r1", "r2"])
    # probes slow enough that the request, not a probe, meets the dead replica first
    srv, app = router_server(router_settings([dead_url(), *fleet.urls],
                                             health={"interval": 60, "eject_after": 10}))
    key = key_homed_on(app, "r0")  # r0 is the dead one
    r = httpx.post(srv.url + "/v1/chat/completions", json=chat(), headers={"x-prefix-hash": key})
    assert r.status_code == 200
    served_by = r.headers["x-prefix-router-replica"]
    assert served_by in ("r1", "r2")
    assert r.json()["choices"][0]["message"]["content"] == served_by
    metrics = httpx.get(srv.url + "/metrics").text
    assert 'prefix_router_retries_total{reason="connect",replica="r0"} 1.0' in metrics


def test_upstream_503_retried_then_last_answer_relayed(fake_fleet: Any,
                                                         router_server: Any) -> None:
    fleet = fake_fleet(2)
    srv, app = router_server(router_settings(fleet.urls, proxy={"max_attempts": 2}))
    r = httpx.post(srv.url + "/v1/chat/completions", json=chat(),
                   headers={"x-fake-status": "503", "x-prefix-hash": key_homed_on(app, "r0")})
    # both replicas answered 503: the second answer reaches the client unchanged
    assert r.status_code == 503
    assert r.json()["error"]["message"] == "r1 says 503"
    assert fleet.counts() == {"r0": 1, "r1": 1}
    # fewer replicas than max_attempts (3): the last candidate's 503 is relayed too
    srv3, app3 = router_server(router_settings(fleet.urls))
    r = httpx.post(srv3.url + "/v1/chat/completions", json=chat(),
                   headers={"x-fake-status": "503", "x-prefix-hash": key_homed_on(app3, "r1")})
    assert r.status_code == 503 and r.json()["error"]["message"] == "r0 says 503"
    assert fleet.counts() == {"r0": 2, "r1": 2}
    # a 4xx is the replica's answer, never retried
    r = httpx.post(srv.url + "/v1/chat/completions", json=chat(),
                   headers={"x-fake-status": "422", "x-prefix-hash": key_homed_on(app, "r0")})
    assert r.status_code == 422 and fleet.counts() == {"r0": 3, "r1": 2}


def test_raw_body_bytes_and_end_to_end_headers_reach_the_replica(fake_fleet: Any,
                                                                   router_server: Any) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls))
    raw = ('{ "messages":[{"role":"system","content":"' + SYSTEM + '"},'
           '{"role":"user","content":"h\\u00e9"}],   "model" : "fake-model", "z":1.50}').encode()
    r = httpx.post(srv.url + "/v1/chat/completions?x=1%2F2", content=raw, headers={
        "content-type": "application/json", "authorization": "Bearer client-key",
        "x-custom": "v", "connection": "x-hop", "x-hop": "drop", "proxy-authorization": "p",
        "expect": "100-continue"})
    assert r.status_code == 200
    seen = fleet.replicas[0].requests[-1]
    assert seen.body == raw  # not re-serialised
    assert seen.headers["authorization"] == "Bearer client-key"
    assert seen.headers["x-custom"] == "v"
    for gone in ("x-hop", "proxy-authorization", "connection", "expect"):
        assert gone not in seen.headers


def test_response_hop_by_hop_headers_dropped(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls))
    r = httpx.get(srv.url + "/v1/echo")
    assert r.status_code == 200 and r.headers["x-upstream"] == "kept"
    for gone in ("keep-alive", "x-drop-me", "proxy-authenticate"):
        assert gone not in r.headers
    assert r.headers["x-prefix-router-replica"] == "r0"


def test_replica_header_can_be_turned_off(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls, proxy={"replica_header": False}))
    r = httpx.get(srv.url + "/v1/echo")
    assert r.status_code == 200 and "x-prefix-router-replica" not in r.headers


def test_upstream_key_replaces_client_authorization(fake_fleet: Any, router_server: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_UPSTREAM_KEY", "vllm-secret")
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls,
                                           auth={"upstream_api_key_env": "TEST_UPSTREAM_KEY"}))
    r = httpx.get(srv.url + "/v1/echo", headers={"authorization": "Bearer client"})
    assert r.json()["headers"]["authorization"] == "Bearer vllm-secret"


def sse_events(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def test_stream_relayed_chunk_by_chunk(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls))
    arrivals: list[float] = []
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=chat(stream=True),
                      headers={"x-fake-chunks": "3", "x-fake-chunk-delay": "0.3"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic())
    assert len(arrivals) == 4  # 3 chunks + [DONE]
    # the first chunk arrived while the replica was still generating (not buffered to the end)
    assert arrivals[-1] - arrivals[0] > 0.5


def test_mid_stream_failure_ends_with_sse_error(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(2)
    srv, app = router_server(router_settings(fleet.urls))
    key = key_homed_on(app, "r0")
    r = httpx.post(srv.url + "/v1/chat/completions", json=chat(stream=True),
                   headers={"x-fake-die-after": "2", "x-prefix-hash": key})
    events = sse_events(r.text)
    assert len(events) == 3
    assert json.loads(events[-1])["error"]["type"] == "server_error"
    assert fleet.counts() == {"r0": 1, "r1": 0}  # no retry once the stream started


def test_idle_timeout_mid_stream(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls, proxy={"idle_timeout": 0.2}))
    r = httpx.post(srv.url + "/v1/chat/completions", json=chat(stream=True),
                   headers={"x-fake-chunks": "3", "x-fake-chunk-delay": "1.0"})
    events = sse_events(r.text)
    assert events[0].startswith("{") and "r0" in events[0]
    assert json.loads(events[-1])["error"]["code"] == "upstream_timeout"


def test_first_byte_timeout_is_504(fake_fleet: Any, router_server: Any) -> None:
    fleet = fake_fleet(1)
    srv, _ = router_server(router_settings(fleet.urls, proxy={"first_byte_timeout": 0.2}))
    r = httpx.post(srv.url + "/v1/chat/completions", json=chat(),
                   headers={"x-fake-delay": "2"})
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "upstream_timeout"


def wait_until(cond: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def raw_request(port: int, body: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
              b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\nx-fake-delay: 3\r\n\r\n"
              + body)
    return s


@pytest.mark.parametrize("own_protocol", [False, True], ids=["uvicorn", "limits"])
@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_aborts_upstream(fake_fleet: Any, router_server: Any,
                                           stream: bool, own_protocol: bool) -> None:
    """Under uvicorn's protocol the proxy's DisconnectWatch awaits receive(); under the
    router's (`router.limits`) the protocol calls the callback in the scope's hook slot."""
    from router.limits import LimitedHttpToolsProtocol

    fleet = fake_fleet(1)
    srv, app = router_server(router_settings(fleet.urls),
                             **({"http": LimitedHttpToolsProtocol} if own_protocol else {}))
    fake = fleet.replicas[0]
    sock = raw_request(srv.port, json.dumps(chat(stream=stream)).encode())
    assert wait_until(lambda: fake.running == 1)
    sock.close()
    assert wait_until(lambda: fake.cancelled == 1)
    r0 = app.replicas.get("r0")
    assert r0 is not None
    assert wait_until(lambda: r0.in_flight == 0)
    assert len(fake.requests) == 1  # a disconnect is never retried
    assert "499" in httpx.get(srv.url + "/metrics").text


_NAMES = st.sampled_from([b"connection", b"keep-alive", b"te", b"upgrade", b"proxy-x",
                          b"transfer-encoding", b"x-a", b"x-b", b"content-type", b"Authorization"])


@given(st.lists(st.tuples(_NAMES, st.sampled_from([b"1", b"x-a", b"close, X-B", b"v"])),
                max_size=12))
def test_strip_hop_by_hop_properties(headers: list[tuple[bytes, bytes]]) -> None:
    out = strip_hop_by_hop(headers)
    named = {t.strip().lower() for n, v in headers if n.lower() == b"connection"
             for t in v.split(b",")}
    for name, _ in out:
        assert name not in HOP_BY_HOP and not name.startswith(b"proxy-") and name not in named
    # everything else survives, in order, with lowered names
    expected = [(n.lower(), v) for n, v in headers
                if n.lower() not in HOP_BY_HOP and not n.lower().startswith(b"proxy-")
                and n.lower() not in named]
    assert out == expected


@pytest.mark.parametrize(("raised", "expected"), [
    # one line per transport failure class: what the proxy sees instead
    (TimeoutError(), UpstreamTimeout),
    (aiohttp.ServerTimeoutError("read"), UpstreamTimeout),
    (aiohttp.ServerDisconnectedError(), UpstreamConnectError),
    (ConnectionResetError(), UpstreamConnectError),
    (aiohttp.ClientOSError(104, "reset"), UpstreamConnectError),
    (aiohttp.ClientPayloadError("bad chunk"), UpstreamError),
    (OSError("weird"), UpstreamError),
])
def test_translate_upstream(raised: Exception, expected: type[UpstreamError]) -> None:
    with pytest.raises(expected) as err, translate_upstream("r7", "stream"):
        raise raised
    assert type(err.value) is expected and "r7" in str(err.value)
    assert err.value.__cause__ is raised


def test_upstream_error_is_translate_upstreams_mapping() -> None:
    """The proxy's hot path maps with `upstream_error` in a try/except: the same error types,
    messages and before_response flag as the context manager, None where it lets go."""
    from router.errors import upstream_error

    for raised in (TimeoutError(), aiohttp.ServerTimeoutError("read"),
                   aiohttp.ConnectionTimeoutError("c"), aiohttp.ServerDisconnectedError(),
                   ConnectionResetError(), aiohttp.ClientPayloadError("bad"), OSError("weird")):
        for before in (False, True):
            with pytest.raises(UpstreamError) as err, translate_upstream("r7", "p", before):
                raise raised
            got = upstream_error(raised, "r7", "p", before)
            assert got is not None and type(got) is type(err.value)
            assert (str(got), got.before_response) == (str(err.value), err.value.before_response)
    for other in (ValueError("x"), asyncio.CancelledError(), UpstreamTimeout("already")):
        assert upstream_error(other, "r7", "p") is None


def test_translate_upstream_leaves_other_exceptions_alone() -> None:
    with pytest.raises(ValueError), translate_upstream("r7", "x"):
        raise ValueError("not a transport failure")
    with pytest.raises(asyncio.CancelledError), translate_upstream("r7", "x"):
        raise asyncio.CancelledError


def test_disconnect_watch_steps_receive_without_a_task() -> None:
    from router.proxy import DisconnectWatch

    async def scenario() -> tuple[list[str], int, bool]:
        event = asyncio.Event()
        cleaned: list[str] = []
        calls: list[str] = []

        async def receive() -> dict[str, str]:
            try:
                await asyncio.sleep(0)      # a bare yield first
                await event.wait()          # then a future
                return {"type": "http.disconnect"}
            finally:
                cleaned.append("receive")

        tasks_before = len(asyncio.all_tasks())
        watch = DisconnectWatch(receive, lambda: calls.append("gone"))
        created = len(asyncio.all_tasks()) - tasks_before
        await asyncio.sleep(0.01)
        assert calls == []
        event.set()
        await asyncio.sleep(0.01)
        watch.close()  # after completion: a no-op

        # closed before the disconnect: the coroutine is closed, the callback never runs
        event2 = asyncio.Event()

        async def receive2() -> dict[str, str]:
            try:
                await event2.wait()
                return {"type": "http.disconnect"}
            finally:
                cleaned.append("receive2")

        other = DisconnectWatch(receive2, lambda: calls.append("wrong"))
        other.close()
        event2.set()
        await asyncio.sleep(0.01)
        return calls + cleaned, created, not event2._waiters

    out, created, detached = asyncio.run(scenario())
    assert out == ["gone", "receive", "receive2"]
    assert created == 0 and detached
