"""Connection-level limits (`router/limits.py`) against a real router process on loopback.

Slowloris: 1,000 connections (scaled) each send a partial request head, then one more header
line every 0.5 s; the router's `limits.header_timeout` is 2 s. Every one must be answered 408
and closed within the deadline plus 1 s of its connection (as the client saw it established), while 100 ordinary requests sent
alongside all succeed; afterwards the router's descriptors and RSS return to their baseline.
Bodies: a body trickled one byte per 0.1 s gets 408 within its deadline; a 16 MiB body sent at
~4 MiB/s (longer than `body_timeout`, faster than `body_min_rate`) is accepted whole. Heads:
5,000 header lines get 431, a 10 KiB request target 414, both in OpenAI error format. Caps:
beyond `max_connections` new connections get 503 with Retry-After at once and are closed, never
left waiting. Deadlines are short here so the suite runs in seconds. Assertions are on outcomes
and lower bounds; the "within the deadline plus 1 s" figures are timing promises (`promise`,
asserted in report runs only).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from loadtest._net import quiet_port
from loadtest.fleet import Fleet
from tests.conftest import ThreadedServer, asgi_lifespan
from tests.reliability.conftest import RouterProcess, metric, promise, router_config, scaled
from tests.reliability.load import chat_body
from tests.reliability.rawhttp import RawHTTP, request

pytestmark = pytest.mark.slow

HEAD_TIMEOUT = 2.0
DRIP_EVERY = 0.5
SLOWLORIS = 1000            # the count; not scaled (the accept backlog is 2,048)
NORMAL = 100
FD_SLACK = 4                 # the replica pool may hold a connection or two more than before
RSS_GROWTH_KIB = 32 * 1024


@pytest.fixture(scope="module", autouse=True)
def descriptors() -> Iterator[None]:
    """Room for the slowloris sockets in this process (the router raises its own limit)."""
    need = SLOWLORIS + NORMAL + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"hard open-file limit {hard} < {need}")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def limited_router(start_router: Callable[..., RouterProcess], urls: list[str],
                   names: list[str] | None = None, **limits: Any) -> RouterProcess:
    return start_router(router_config(urls, names, limits=limits,
                                      admin={"host": "127.0.0.1", "port": quiet_port()}))


def openai_code(body: bytes) -> str:
    err = json.loads(body)["error"]
    assert {"message", "type", "param", "code"} <= set(err)
    return str(err["code"])


# -- slowloris -------------------------------------------------------------------------------
async def slowloris(port: int, t_start: list[float], t_conn: list[float],
                    t_closed: list[float], answers: list[bytes], opened: asyncio.Event,
                    i: int) -> None:
    t_start[i] = time.monotonic()   # before the connect: the router's clock starts later
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t_conn[i] = time.monotonic()    # the connection as this client saw it established
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    opened.set()
    n = 0
    try:
        while True:
            try:
                data = await asyncio.wait_for(reader.read(65536), DRIP_EVERY)
            except TimeoutError:
                n += 1
                writer.write(b"X-Drip-%d: %d\r\n" % (n, n))
                continue
            answers[i] += data
            if not data:
                break
    except OSError:
        pass
    finally:
        t_closed[i] = time.monotonic()
        writer.close()


async def storm(router: RouterProcess) -> dict[str, Any]:
    t_start = [0.0] * SLOWLORIS
    t_conn = [0.0] * SLOWLORIS
    t_closed = [0.0] * SLOWLORIS
    answers = [b""] * SLOWLORIS
    events = [asyncio.Event() for _ in range(SLOWLORIS)]
    tasks = [asyncio.create_task(slowloris(router.port, t_start, t_conn, t_closed, answers, e,
                                           i)) for i, e in enumerate(events)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 30)
    all_open = time.monotonic()
    async with httpx.AsyncClient(timeout=30) as client:
        gauge = metric(router.samples(), "prefix_router_connections")
        sem = asyncio.Semaphore(10)

        async def normal(k: int) -> tuple[int, float]:
            async with sem:
                r = await client.post(router.url + "/v1/chat/completions",
                                      json=chat_body(k, max_tokens=4))
                return r.status_code, time.monotonic()

        normal_results = await asyncio.gather(*(normal(k) for k in range(NORMAL)))
    await asyncio.wait_for(asyncio.gather(*tasks), HEAD_TIMEOUT + 30)
    first_close = min(t_closed)
    return {
        "held": [c - o for o, c in zip(t_conn, t_closed, strict=True)],
        "held_from_start": [c - o for o, c in zip(t_start, t_closed, strict=True)],
        "answers": answers, "gauge_while_open": gauge,
        "normal_status": [s for s, _ in normal_results],
        "normal_before_first_close": sum(t < first_close for _, t in normal_results),
        "connect_seconds": all_open - min(t_conn),
    }


def test_slowloris_is_closed_at_the_head_deadline(start_fleet: Callable[..., Fleet],
                                                  start_router: Callable[..., RouterProcess],
                                                  measure: Callable[..., None]) -> None:
    fleet = start_fleet(1, instant=True)
    router = limited_router(start_router, fleet.urls, fleet.names, header_timeout=HEAD_TIMEOUT,
                            max_connections=SLOWLORIS + 200)
    with httpx.Client(timeout=10) as c:   # warm the replica pool as the storm's requests will
        for k in range(20):
            assert c.post(router.url + "/v1/chat/completions",
                          json=chat_body(k, max_tokens=4)).status_code == 200
    time.sleep(0.5)
    fds_before, rss_before = fd_count(router.pid), router.rss_kib()

    out = asyncio.run(storm(router))

    held = sorted(out["held"])
    earliest = min(out["held_from_start"])
    answered = sum(a.startswith(b"HTTP/1.1 408 ") for a in out["answers"])
    deadline = time.monotonic() + 10
    while fd_count(router.pid) > fds_before + FD_SLACK and time.monotonic() < deadline:
        time.sleep(0.1)
    fds_after, rss_after = fd_count(router.pid), router.rss_kib()
    samples = router.samples()
    measure("limits_slowloris", connections=SLOWLORIS, header_timeout_s=HEAD_TIMEOUT,
            drip_every_s=DRIP_EVERY, connect_all_s=round(out["connect_seconds"], 2),
            held_min_s=round(held[0], 2), held_p50_s=round(held[len(held) // 2], 2),
            held_from_connect_call_min_s=round(earliest, 2),
            answered_408=answered,
            connections_gauge_while_open=out["gauge_while_open"],
            normal_requests=NORMAL, normal_ok=out["normal_status"].count(200),
            normal_done_before_first_close=out["normal_before_first_close"],
            router_fds_before=fds_before, router_fds_after=fds_after,
            router_rss_mib_before=round(rss_before / 1024, 1),
            router_rss_mib_after=round(rss_after / 1024, 1))
    # held: from the connection established (as this client saw it) to the close it saw
    promise(measure, "limits_slowloris", "held_max", held[-1], HEAD_TIMEOUT + 1.0)
    assert out["normal_status"] == [200] * NORMAL
    assert answered == SLOWLORIS
    # and none closed early, though dripping: measured from before its connect, which the
    # router's clock cannot precede (but for the event-loop iteration that accepted it)
    assert earliest >= HEAD_TIMEOUT - 0.25
    assert out["gauge_while_open"] >= SLOWLORIS
    assert metric(samples, "prefix_router_rejected_total", reason="header_timeout") == SLOWLORIS
    assert fds_after <= fds_before + FD_SLACK
    assert rss_after - rss_before < RSS_GROWTH_KIB
    assert metric(samples, "prefix_router_connections") == 0


# -- bodies ----------------------------------------------------------------------------------
class CountingUpstream:
    """Answers every /v1 request with the number of body bytes it received."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await asgi_lifespan(receive, send)
            return
        size, more = 0, True
        while more:
            msg = await receive()
            size += len(msg.get("body", b""))
            more = msg.get("more_body", False)
        body = json.dumps({"received": size}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def counting_upstream() -> Iterator[ThreadedServer]:
    srv = ThreadedServer(CountingUpstream()).start()
    yield srv
    srv.stop()


BODY_TIMEOUT = 1.0
MIN_RATE = 1024 * 1024
SEND_RATE = 4 * 1024 * 1024


def send_paced(sock: socket.socket, data: bytes, rate: float, piece: int = 256 * 1024) -> float:
    t0 = time.monotonic()
    for i in range(0, len(data), piece):
        sock.sendall(data[i:i + piece])
        ahead = t0 + (i + piece) / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    return time.monotonic() - t0


def read_answer(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of one response with a Content-Length (the router's own answers and
    the counting upstream's, relayed)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole head: {raw[:200]!r}"
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed before the whole body"
        body += chunk
    return int(head.split(b" ", 2)[1]), body


def test_body_deadline_and_rate(counting_upstream: ThreadedServer,
                                start_router: Callable[..., RouterProcess],
                                measure: Callable[..., None]) -> None:
    router = start_router(router_config(
        [counting_upstream.url], ["count"], limits={"body_timeout": BODY_TIMEOUT,
                                                    "body_min_rate": MIN_RATE},
        admin={"host": "127.0.0.1", "port": quiet_port()},
        logging={"level": "info", "access_log": True}))
    # a trickle: 100,000 bytes declared, one a tenth of a second
    with socket.create_connection(("127.0.0.1", router.port), timeout=15) as s:
        s.sendall(request("POST", "/v1/chat/completions", content_length=b"100000"))
        t0 = time.monotonic()
        s.settimeout(0.1)
        raw, sent = b"", 0
        while time.monotonic() - t0 < 15 and not raw.endswith(b"}"):
            try:
                s.sendall(b" ")
                sent += 1
                raw += s.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
        trickle_s = time.monotonic() - t0
    trickle_status = int(raw.split(b" ", 2)[1]) if raw else None
    # 16 MiB (the default max_body_bytes) at ~4 MiB/s: ~4 s, four times body_timeout
    content = "x" * (16 * 1024 * 1024 - 200)
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()
    assert len(big) <= 16 * 1024 * 1024
    with socket.create_connection(("127.0.0.1", router.port), timeout=60) as s:
        s.sendall(request("POST", "/v1/chat/completions", b"",
                          content_length=str(len(big)).encode()))
        upload_s = send_paced(s, big, SEND_RATE)
        big_status, big_body = read_answer(s)
    samples = router.samples()
    measure("limits_body", body_timeout_s=BODY_TIMEOUT, body_min_rate=MIN_RATE,
            trickle_status=trickle_status, trickle_bytes_sent=sent,
            trickle_answered_after_s=round(trickle_s, 2), big_body_bytes=len(big),
            big_upload_s=round(upload_s, 2), big_status=big_status)
    promise(measure, "limits_body", "trickle_answered", trickle_s,
            round(BODY_TIMEOUT + sent / MIN_RATE + 1.0, 3))
    assert trickle_status == 408 and openai_code(raw.partition(b"\r\n\r\n")[2]) == \
        "request_timeout"
    assert big_status == 200 and json.loads(big_body) == {"received": len(big)}
    assert upload_s > BODY_TIMEOUT   # the rate, not a fixed deadline, let it through
    assert metric(samples, "prefix_router_rejected_total", reason="body_timeout") == 1
    router.stop()   # flushes the access log
    lines = [json.loads(line) for line in router.output().splitlines() if line.startswith("{")]
    # one line per request: the trickle's names its limit (the app wrote no 499 of its own)
    assert [(ln["status"], ln.get("limit")) for ln in lines] == [
        (408, "limits.body_timeout"), (200, None)]
    # (the byte sent in the round whose read brought the 408 may have come after the expiry)
    assert lines[0]["path"] == "/v1/chat/completions" and sent - 1 <= lines[0]["bytes_in"] <= sent


# -- heads -----------------------------------------------------------------------------------
def test_head_size_limits(start_fleet: Callable[..., Fleet],
                          start_router: Callable[..., RouterProcess],
                          measure: Callable[..., None]) -> None:
    """Default limits (100 headers, 32 KiB of them, an 8 KiB request line)."""
    fleet = start_fleet(1, instant=True)
    router = start_router(router_config(fleet.urls, fleet.names))
    body = json.dumps(chat_body(1, max_tokens=4)).encode()
    many = [(b"X-Filler-%d" % i, b"v") for i in range(5000)]
    cases = {
        "headers_5000": request("POST", "/v1/chat/completions", body, many),
        "headers_99": request("POST", "/v1/chat/completions", body, many[:96]),
        "one_header_64k": request("POST", "/v1/chat/completions", body,
                                  [(b"X-Big", b"a" * 65536)]),
        "url_10k": request("POST", "/v1/chat/completions?q=" + "a" * 10240, body),
    }
    got: dict[str, Any] = {}
    for name, raw in cases.items():
        client = RawHTTP(router.port)
        t0 = time.monotonic()
        resp = client.send(raw)
        got[name] = {"status": resp.status, "ms": round((time.monotonic() - t0) * 1000, 1),
                     "code": openai_code(resp.body) if resp.status != 200 else None}
        client.close()
    measure("limits_heads", **got)
    assert got["headers_5000"]["status"] == 431
    assert got["headers_5000"]["code"] == "request_header_fields_too_large"
    assert got["headers_99"]["status"] == 200
    assert got["one_header_64k"]["status"] == 431
    assert got["url_10k"]["status"] == 414 and got["url_10k"]["code"] == "request_line_too_long"
    samples = router.samples()
    assert metric(samples, "prefix_router_rejected_total", reason="too_many_headers") == 1
    assert metric(samples, "prefix_router_rejected_total", reason="headers_too_large") == 1
    assert metric(samples, "prefix_router_rejected_total", reason="request_line_too_long") == 1


# -- connection caps -------------------------------------------------------------------------
CAP = 50
BEYOND = scaled(200)


def test_connections_beyond_the_cap_are_refused(start_fleet: Callable[..., Fleet],
                                                start_router: Callable[..., RouterProcess],
                                                measure: Callable[..., None]) -> None:
    fleet = start_fleet(1, instant=True)
    router = limited_router(start_router, fleet.urls, fleet.names, max_connections=CAP,
                            header_timeout=60.0)
    time.sleep(0.3)
    fds_before = fd_count(router.pid)
    held = [socket.create_connection(("127.0.0.1", router.port), timeout=10)
            for _ in range(CAP)]
    try:
        deadline = time.monotonic() + 10
        while metric(router.samples(), "prefix_router_connections") < CAP:
            assert time.monotonic() < deadline, "the held connections were not all accepted"
            time.sleep(0.05)
        statuses: list[int | None] = []
        seconds: list[float] = []
        lock = threading.Lock()

        def beyond() -> None:
            t0 = time.monotonic()
            with socket.create_connection(("127.0.0.1", router.port), timeout=10) as s:
                s.sendall(request("GET", "/health", content_type=None))
                status, _ = read_answer(s)
                rest = s.recv(1)   # then closed: EOF, not a wait
            with lock:
                statuses.append(status if rest == b"" else None)
                seconds.append(time.monotonic() - t0)

        threads = [threading.Thread(target=beyond) for _ in range(BEYOND)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        still_held = metric(router.samples(), "prefix_router_connections")
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 10
    while fd_count(router.pid) > fds_before and time.monotonic() < deadline:
        time.sleep(0.05)
    with httpx.Client(timeout=10) as c:
        after = c.post(router.url + "/v1/chat/completions", json=chat_body(1, max_tokens=4))
    samples = router.samples()
    measure("limits_cap", max_connections=CAP, beyond=BEYOND,
            refused_503=statuses.count(503),
            held_while_refusing=still_held, after_release_status=after.status_code,
            router_fds_before=fds_before, router_fds_after=fd_count(router.pid))
    promise(measure, "limits_cap", "refused_max", max(seconds), 1.0)
    assert statuses == [503] * BEYOND   # each answered and then closed (EOF), none left waiting
    assert still_held == CAP
    assert after.status_code == 200
    assert metric(samples, "prefix_router_rejected_total", reason="too_many_connections") == \
        BEYOND
    assert fd_count(router.pid) <= fds_before + FD_SLACK


# -- several workers -------------------------------------------------------------------------
def test_limits_hold_with_workers(start_fleet: Callable[..., Fleet],
                                  start_router: Callable[..., RouterProcess]) -> None:
    """`--workers 2`: each worker imports the protocol by name and finds its app's guard."""
    fleet = start_fleet(1, instant=True)
    cfg = router_config(fleet.urls, fleet.names, limits={"header_timeout": 2.0})
    cfg["workers"] = 2
    router = start_router(cfg)

    async def drip(n: int) -> list[bytes]:
        async def one() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            try:
                return await asyncio.wait_for(reader.read(), 10)
            finally:
                writer.close()
        return await asyncio.gather(*(one() for _ in range(n)))

    answers = asyncio.run(drip(40))
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers)
    client = RawHTTP(router.port)
    resp = client.send(request("GET", "/health", b"", [(b"X-H%d" % i, b"v")
                                                         for i in range(500)]))
    client.close()
    assert resp.status == 431
    with httpx.Client(timeout=10) as c:
        assert c.post(router.url + "/v1/chat/completions",
                      json=chat_body(2, max_tokens=4)).status_code == 200
    assert metric(router.samples(), "prefix_router_rejected_total",
                  reason="header_timeout") == 40
