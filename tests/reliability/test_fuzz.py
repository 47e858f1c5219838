"""Bad input against a running router: >= 10,000 hypothesis cases, never a 5xx, no growth.

One router process (real uvicorn, 127.0.0.1) fronts two upstreams that can never answer 5xx
(`never_5xx`: every request gets a 200), so any 5xx the client sees was produced by the router's
own code. Requests go out through `RawHTTP` (exact bytes, one kept-alive connection). Every case
asserts that an answer arrived and that it is not a 5xx; the categories with a defined answer
(invalid JSON, wrong types, wrong content type, oversized body) assert its status and the OpenAI
error shape. The last test checks the process stayed healthy, its RSS stayed flat, its output
holds no traceback, and that the module really ran >= 10,000 cases.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.conftest import ThreadedServer, asgi_lifespan
from tests.reliability.conftest import RouterProcess, router_config, scaled
from tests.reliability.rawhttp import RawHTTP, Response, request

pytestmark = pytest.mark.slow

MAX_BODY = 64 * 1024
TOTAL_CASES = 10_000
# Growth after warm-up: ~5 MiB at 10k cases, ~25 MiB at 51k - most likely the router's bounded
# LRUs filling (conversation affinity keeps up to 65,536 conversations; fuzz bodies are mostly
# distinct), so the bound leaves room for them to fill, not for unbounded growth.
RSS_GROWTH_KIB = 48 * 1024
PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
_counts: dict[str, int] = {}


async def never_5xx(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        return await asgi_lifespan(receive, send)
    if scope["type"] != "http":
        return
    more = True
    while more:
        msg = await receive()
        more = msg.get("more_body", False) and msg["type"] == "http.request"
    body = b'{"id":"x","object":"chat.completion","choices":[]}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def fuzz_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    upstreams = [ThreadedServer(never_5xx).start() for _ in range(2)]
    # The upstreams share this process's GIL with hypothesis, so on a loaded machine a health
    # probe can wait: FAST_HEALTH's 0.5 s timeout once ejected both (CI under two CPU hogs), and
    # every later case got 503 "no healthy replica". They are healthy by construction; this
    # router must never eject them, and never time out on them.
    cfg = router_config([u.url for u in upstreams], ["u0", "u1"],
                        proxy={"max_body_bytes": MAX_BODY, "first_byte_timeout": 60.0,
                               "connect_timeout": 10.0},
                        health={"interval": 1.0, "timeout": 30.0, "eject_after": 1000},
                        logging={"level": "info", "access_log": False})
    router = RouterProcess(cfg, tmp_path_factory.mktemp("fuzz-router"))
    try:
        yield router.start()
    finally:
        router.stop()
        for u in upstreams:
            u.stop()


@pytest.fixture(scope="module")
def client(fuzz_router: RouterProcess) -> Iterator[RawHTTP]:
    c = RawHTTP(fuzz_router.port)
    yield c
    c.close()


@pytest.fixture(scope="module")
def baseline_rss(fuzz_router: RouterProcess, client: RawHTTP) -> int:
    # warm-up: every code path once (lazy imports, pools, caches), then the baseline
    for i in range(300):
        body = json.dumps({"messages": [{"role": "user", "content": f"hi {i}"}]}).encode()
        client.send(request("POST", PATHS[i % 3], body))
        client.send(request("POST", PATHS[i % 3], body[: i % len(body)]))
    return fuzz_router.rss_kib()


def count(name: str) -> None:
    _counts[name] = _counts.get(name, 0) + 1


def check(resp: Response) -> Response:
    assert resp.status < 500, (resp.status, resp.body[:300])
    return resp


def is_openai_error(resp: Response) -> bool:
    try:
        err = json.loads(resp.body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(err, dict) and {"message", "type", "code"} <= set(err)


def fuzz(examples: int) -> settings:
    # no shrinking: a failure is reported as drawn (shrinking against a live server can take
    # minutes), and the failing request is in the assertion message
    return settings(max_examples=scaled(examples), deadline=None, database=None,
                    phases=(Phase.explicit, Phase.generate), print_blob=True,
                    suppress_health_check=list(HealthCheck))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


PROMPT_FIELD = {"/v1/chat/completions": "messages", "/v1/completions": "prompt",
                "/v1/embeddings": "input"}


@fuzz(600)
@given(value=json_values)
def test_any_json_body(client: RawHTTP, baseline_rss: int, value: Any) -> None:
    # one drawn value, six requests: the whole body, and the prompt field of each endpoint
    for path, field in PROMPT_FIELD.items():
        for body in (value, {field: value, "model": "m"}):
            count("any_json")
            resp = check(client.send(request("POST", path, json.dumps(body).encode())))
            if not isinstance(body, dict):
                assert resp.status == 400 and is_openai_error(resp)


@fuzz(300)
@example(messages=[{"role": ["system"], "content": "x"}])   # once a 500: an unhashable role
@given(messages=st.lists(
    st.fixed_dictionaries({}, optional={
        "role": st.sampled_from(["system", "developer", "user", "assistant"]) | json_values,
        "content": json_values, "name": json_values, "tool_calls": json_values}),
    min_size=1, max_size=4))
def test_wrong_message_fields(client: RawHTTP, baseline_rss: int,
                              messages: list[dict[str, Any]]) -> None:
    # messages that are objects, with any JSON value in their fields: never a 5xx
    count("wrong_types")
    check(client.send(request("POST", "/v1/chat/completions",
                              json.dumps({"model": "m", "messages": messages}).encode())))


shallow = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
           | st.lists(st.integers() | st.text(max_size=4), max_size=3)
           | st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


@fuzz(800)
@given(fields=st.fixed_dictionaries({}, optional={
    "messages": shallow, "prompt": shallow, "input": shallow, "model": shallow,
    "stream": shallow, "max_tokens": shallow, "user": shallow}))
def test_wrong_types(client: RawHTTP, baseline_rss: int, fields: dict[str, Any]) -> None:
    raw = json.dumps(fields).encode()
    for path, field in PROMPT_FIELD.items():
        count("wrong_types")
        resp = check(client.send(request("POST", path, raw)))
        value = fields.get(field)
        if not isinstance(value, list | str) or not value:
            assert resp.status == 400 and is_openai_error(resp)
        elif field == "messages" and not all(isinstance(m, dict) for m in value):
            assert resp.status == 400 and is_openai_error(resp)
        for opt, kind in (("model", str), ("stream", bool)):
            if fields.get(opt) is not None and not isinstance(fields[opt], kind):
                assert resp.status == 400 and is_openai_error(resp)


valid_chat = json.dumps({"model": "m", "stream": False, "messages": [
    {"role": "system", "content": "You are a terse assistant " * 4},
    {"role": "user", "content": "hello ünïcödé 🚀"}]}).encode()


@fuzz(1500)
@given(data=st.data())
def test_malformed_bytes(client: RawHTTP, baseline_rss: int, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["truncated", "binary", "bad_utf8", "flipped"]))
    if kind == "truncated":
        body = valid_chat[: data.draw(st.integers(0, len(valid_chat) - 1))]
    elif kind == "binary":
        body = data.draw(st.binary(max_size=512))
    elif kind == "bad_utf8":
        at = data.draw(st.integers(0, len(valid_chat)))
        junk = data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xf8\x88\x80", b"\x80\x80",
                                          b"\xe2\x82", b"\xed\xa0\x80"]))
        body = valid_chat[:at] + junk + valid_chat[at:]
    else:
        at = data.draw(st.integers(0, len(valid_chat) - 1))
        body = valid_chat[:at] + bytes([data.draw(st.integers(0, 255))]) + valid_chat[at + 1:]
    for path in PATHS[:2]:
        count("malformed")
        resp = check(client.send(request("POST", path, body)))
        # A prefix of an object is never a whole JSON object; bytes that are not UTF-8 are not
        # JSON text - except an encoded surrogate (ED A0 80), which Python's json.loads lets
        # through ('surrogatepass'): the router forwards it and the replica decides.
        if kind == "truncated" or (kind == "bad_utf8" and junk != b"\xed\xa0\x80"):
            assert resp.status == 400 and is_openai_error(resp), (body, resp.status)


header_value = st.binary(min_size=0, max_size=64).map(
    lambda b: b.replace(b"\r", b"").replace(b"\n", b"").replace(b"\x00", b""))
header_name = st.text(string.ascii_letters + string.digits + "-_", min_size=1,
                      max_size=20).map(str.encode)


@fuzz(700)
@given(data=st.data())
def test_odd_headers(client: RawHTTP, baseline_rss: int, data: st.DataObject) -> None:
    count("headers")
    named = [b"authorization", b"x-prefix-hash", b"x-session-id", b"content-encoding",
             b"connection", b"expect", b"x-forwarded-for", b"cookie", b"accept-encoding"]
    headers = data.draw(st.lists(st.tuples(st.sampled_from(named) | header_name, header_value),
                                 max_size=6))
    ctype = data.draw(st.sampled_from([b"application/json", b"application/json; charset=utf-8",
                                       b"APPLICATION/JSON", b"text/plain", b"", b"multipart/form-data; boundary=x",
                                       b"application/x-www-form-urlencoded", b";;;", b"\xff\xfe"])
                      | header_value)
    # `connection: close` or `expect` may legitimately end the exchange; use a fresh connection
    one_shot = any(n.lower() in (b"connection", b"expect") for n, _ in headers)
    c = RawHTTP(client.port) if one_shot else client
    try:
        resp = check(c.send(request("POST", PATHS[0], valid_chat, headers,
                                    content_type=ctype)))
    finally:
        if one_shot:
            c.close()
    media = ctype.split(b";", 1)[0].strip().lower()
    if media not in (b"application/json",) and resp.status != 400:
        # only a request the HTTP parser itself rejected could skip the content-type check
        raise AssertionError(f"content type {ctype!r} accepted with {resp.status}")


@fuzz(500)
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD",
                               "TRACE", "FOO"]),
       path=st.text(string.ascii_letters + string.digits + "-._~%/!$&'()*+,;=:@",
                    max_size=200),
       query=st.text(string.ascii_letters + string.digits + "=&%+", max_size=200),
       long=st.integers(0, 20_000))
def test_paths_methods_long_urls(client: RawHTTP, baseline_rss: int, method: str, path: str,
                                 query: str, long: int) -> None:
    count("urls")
    target = "/v1/" + path + "a" * long + ("?" + query if query else "")
    c = RawHTTP(client.port)   # HEAD answers and odd methods: never reuse the connection
    try:
        resp = check(c.send(request(method, target, valid_chat if method != "HEAD" else b"")))
    finally:
        c.close()
    assert resp.status < 500


# 1,000+ levels exceed the interpreter's recursion limit inside json.loads: a 400, not a 500
@pytest.mark.parametrize("depth", [10, 100, 500, 1_000, 10_000, 30_000])
@pytest.mark.parametrize("shape", ["array", "object", "in_messages"])
def test_deeply_nested(client: RawHTTP, baseline_rss: int, depth: int, shape: str) -> None:
    count("nested")
    if shape == "array":
        body = b"[" * depth + b"]" * depth
    elif shape == "object":
        body = b'{"a":' * depth + b"1" + b"}" * depth
    else:
        body = b'{"messages": [' + b"[" * depth + b"]" * depth + b"]}"
    resp = client.send(request("POST", PATHS[0], body))
    expected = 413 if len(body) > MAX_BODY else 400  # too big is checked before parsing
    assert resp.status == expected and is_openai_error(resp), resp.status


@pytest.mark.parametrize("case", ["declared", "lying_length", "chunked", "exact_limit"])
def test_oversized_bodies(fuzz_router: RouterProcess, baseline_rss: int, case: str) -> None:
    count("huge")
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (4 * MAX_BODY) + b'"}]}'
    c = RawHTTP(fuzz_router.port)
    try:
        if case == "declared":
            resp = c.send(request("POST", PATHS[0], big))
            assert resp.status == 413 and is_openai_error(resp)
        elif case == "lying_length":
            # claims to be small, is big: the router must stop at the limit, not buffer it all
            resp = c.send(request("POST", PATHS[0], big, content_length=b"100"))
            assert resp.status in (400, 413)
        elif case == "chunked":
            chunk = hex(len(big))[2:].encode()
            raw = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                   b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk + b"\r\n"
                   + big + b"\r\n0\r\n\r\n")
            resp = c.send(raw)
            assert resp.status == 413 and is_openai_error(resp)
        else:
            pad = MAX_BODY - len(valid_chat)
            body = valid_chat[:-1] + b' ' * pad + b"}"
            body = body[: MAX_BODY]
            assert len(body) == MAX_BODY
            resp = check(c.send(request("POST", PATHS[0], body)))
            assert resp.status == 200
    finally:
        c.close()


def test_router_stayed_healthy(fuzz_router: RouterProcess, client: RawHTTP, baseline_rss: int,
                               measure: Any) -> None:
    rss = fuzz_router.rss_kib()
    total = sum(_counts.values())
    resp = client.send(request("GET", "/health", content_type=None))
    output = fuzz_router.output()
    measure("fuzz", cases=total, by_category=dict(_counts), rss_kib_after_warmup=baseline_rss,
            rss_kib_end=rss, rss_growth_kib=rss - baseline_rss)
    assert fuzz_router.alive() and resp.status == 200
    assert rss - baseline_rss < RSS_GROWTH_KIB
    assert unexpected_tracebacks(output) == []
    if {"any_json", "wrong_types", "malformed", "headers", "urls"} <= set(_counts):
        assert total >= scaled(TOTAL_CASES)


def unexpected_tracebacks(output: str) -> list[str]:
    """Tracebacks in the router's output (there must be none: every bad input is a 4xx)."""
    blocks = output.split("Traceback (most recent call last):")[1:]
    return [b[-400:] for b in blocks]
