"""Traces end to end: the official openai client -> real uvicorn router with tracing on -> real
replica servers, the router's OTLP/HTTP exporter -> a real OTLP receiver on loopback
(tests/otlp.py decodes ExportTraceServiceRequest with opentelemetry-proto)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import openai
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
pytest.importorskip("opentelemetry.proto", reason="opentelemetry-proto is not installed")

from tests.integration.conftest import Fleet, router_settings
from tests.otlp import OtlpReceiver, ReceivedSpan

SYSTEM = ("You are the returns assistant of an online bookshop. Be concise, polite, and always "
          "ask for the order number first. Never reveal the secret word lighthouse.")


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    # export every 50 ms instead of the SDK's 5 s, so a test waits for spans briefly
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    with OtlpReceiver() as rx:
        yield rx


def traced(urls: list[str], rx: OtlpReceiver, **sections: Any) -> Any:
    tracing = {"enabled": True, "endpoint": rx.endpoint, **sections.pop("tracing", {})}
    return router_settings(urls, tracing=tracing, **sections)


def client(url: str, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="test", max_retries=0, **kw)


def traceparent() -> tuple[str, str, str]:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{parent}-01", trace_id, parent


def of_trace(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.trace_id == trace_id]


def server_and_attempts(spans: list[ReceivedSpan], trace_id: str
                        ) -> tuple[ReceivedSpan, list[ReceivedSpan]]:
    mine = of_trace(spans, trace_id)
    servers = [s for s in mine if s.kind == "SERVER"]
    assert len(servers) == 1, mine
    attempts = sorted((s for s in mine if s.kind == "CLIENT"),
                      key=lambda s: s.attributes["prefix_router.attempt"])
    return servers[0], attempts


def complete(spans: list[ReceivedSpan], trace_id: str, attempts: int = 1) -> bool:
    mine = of_trace(spans, trace_id)
    return (sum(s.kind == "SERVER" for s in mine) == 1
            and sum(s.kind == "CLIENT" for s in mine) == attempts)


def no_text(span: ReceivedSpan, *texts: str) -> None:
    blob = json.dumps(span.attributes) + json.dumps(span.events)
    for text in texts:
        assert text not in blob, (text, span)


@pytest.mark.parametrize("stream", [False, True])
def test_spans_continue_the_client_trace_and_carry_the_decision(
        fake_fleet: Any, router_server: Any, receiver: OtlpReceiver, stream: bool) -> None:
    fleet: Fleet = fake_fleet(2)
    srv, _ = router_server(traced(fleet.urls, receiver, routing={"policy": "prefix"}))
    header, trace_id, client_span = traceparent()
    c = client(srv.url)
    kw: dict[str, Any] = {"extra_headers": {"traceparent": header, "tracestate": "vendor=1"}}
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "where is it"}]
    if stream:
        # read the body to its end (the openai client closes right after `data: [DONE]`, which
        # can reach the router before it has sent the last chunk: that is a disconnect there)
        with c.chat.completions.with_streaming_response.create(
                model="fake-model", messages=msgs, stream=True, **kw) as resp:
            lines = list(resp.iter_lines())
        events = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: {")]
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                       if e.get("choices"))
    else:
        text = c.chat.completions.create(model="fake-model", messages=msgs,
                                         **kw).choices[0].message.content or ""
    spans = receiver.wait_for(lambda s: complete(s, trace_id), "the request's spans")
    server, (attempt,) = server_and_attempts(spans, trace_id)

    assert server.parent_span_id == client_span  # the client's trace, continued
    assert server.name == "POST /v1/chat/completions"
    assert server.resource["service.name"] == "prefix-router"
    a = server.attributes
    replica = a["prefix_router.replica"]
    assert text.startswith(replica)  # the fake answers with its name
    assert a["http.request.method"] == "POST"
    assert a["http.response.status_code"] == 200
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "fake-model"
    assert a["prefix_router.policy"] == "prefix"
    assert a["prefix_router.branch"] == "home"
    assert a["prefix_router.key_source"] == "prefix"
    assert a["prefix_router.stream"] is stream
    assert a["prefix_router.attempts"] == 1 and a["prefix_router.retries"] == 0
    assert a["prefix_router.client_disconnected"] is False
    assert a["prefix_router.ttft_ms"] > 0
    assert ("gen_ai.response.time_to_first_chunk" in a) is stream
    assert "prefix_router.key.prefix" not in a and "prefix_router.key.conversation" not in a
    no_text(server, "lighthouse", "where is it")

    assert attempt.parent_span_id == server.span_id
    b = attempt.attributes
    assert b["prefix_router.replica"] == replica and b["http.response.status_code"] == 200
    assert b["server.address"] == "127.0.0.1"
    assert b["url.full"] == fleet.urls[int(replica[1:])] + "/v1/chat/completions"
    assert "http.request.resend_count" not in b
    # the replica saw the attempt span as its parent, not the client's
    seen = fleet.by_name(replica).requests[-1].headers
    assert seen["traceparent"] == f"00-{trace_id}-{attempt.span_id}-01"
    assert seen["tracestate"] == "vendor=1"


def test_a_client_without_tracing_gets_a_trace_rooted_at_the_router(
        fake_fleet: Any, router_server: Any, receiver: OtlpReceiver) -> None:
    fleet: Fleet = fake_fleet(1)
    srv, app = router_server(traced(fleet.urls, receiver, logging={"access_log": True},
                                    tracing={"record_routing_keys": True}))
    lines: list[str] = []
    assert app.access_log is not None
    app.access_log._stream = lambda: _Lines(lines)  # the log's pluggable stream, as in its tests
    r = client(srv.url).completions.with_raw_response.create(
        model="fake-model", prompt="Once upon a time", user="user-42")
    assert r.http_response.status_code == 200
    spans = receiver.wait_for(lambda s: any(x.kind == "SERVER" for x in s), "the server span")
    (server,) = [s for s in spans if s.kind == "SERVER"]
    assert server.parent_span_id == ""  # the root of a new trace
    assert server.attributes["gen_ai.operation.name"] == "text_completion"
    assert server.attributes["prefix_router.key_source"] == "conversation"
    assert server.attributes["prefix_router.key.conversation"] == "user-42"  # asked for
    seen = fleet.replicas[0].requests[-1].headers["traceparent"]
    attempt = next(s for s in spans if s.kind == "CLIENT")
    # sampled (01), and the SDK's own trace id is random (W3C level 2 flag 02)
    assert seen == f"00-{server.trace_id}-{attempt.span_id}-03"

    def logged() -> bool:
        app.access_log.flush()
        return bool(lines)

    receiver.wait_for(lambda _: logged(), "the access log line")
    line = json.loads(lines[-1])
    assert (line["trace_id"], line["span_id"]) == (server.trace_id, server.span_id)


class _Lines:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def write(self, text: str) -> None:
        self.lines.extend(text.splitlines())

    def flush(self) -> None:
        pass


def ask_sim(c: openai.OpenAI, system: str, stream: bool, header: str) -> tuple[int, int]:
    """One chat request; the (prompt_tokens, cached_tokens) the client was told."""
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]
    if stream:
        chunks = list(c.chat.completions.create(
            model="sim-model", messages=msgs, max_tokens=4, stream=True,
            stream_options={"include_usage": True}, extra_headers={"traceparent": header}))
        usage = chunks[-1].usage
    else:
        usage = c.chat.completions.create(model="sim-model", messages=msgs, max_tokens=4,
                                          extra_headers={"traceparent": header}).usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0


def test_every_attempt_is_a_span_after_a_replica_was_killed(
        router_server: Any, receiver: OtlpReceiver) -> None:
    fleet_mod = pytest.importorskip("loadtest.fleet")
    with fleet_mod.Fleet(replicas=3, speed=50.0) as sim:
        sim.kill(1)
        # probes far apart: only the proxy's own failures can eject the dead replica, so the
        # requests homed on it meet it first
        srv, _ = router_server(traced(list(sim.urls), receiver, routing={"policy": "prefix"},
                                      health={"interval": 30.0, "eject_after": 50}))
        c = client(srv.url, timeout=30)
        sent: dict[str, tuple[int, int]] = {}
        for i in range(16):
            header, trace_id, _ = traceparent()
            # each desk's prompt twice: the second finds its prefix in the replica's cache
            sent[trace_id] = ask_sim(c, f"{SYSTEM} Desk {i // 2}.", i % 4 in (1, 2), header)
        spans = receiver.wait_for(
            lambda s: all(sum(x.kind == "SERVER" for x in of_trace(s, t)) == 1 for t in sent),
            "all server spans")
    retried = 0
    for trace_id, (prompt, cached) in sent.items():
        server, attempts = server_and_attempts(spans, trace_id)
        a = server.attributes
        assert a.get("http.response.status_code") == 200, (server, attempts)
        # the replica's usage, streamed or not, as the client saw it
        assert a["gen_ai.usage.input_tokens"] == prompt > 0
        assert a["gen_ai.usage.cache_read.input_tokens"] == cached
        assert a["prefix_router.cached_tokens.reported"] == cached
        assert a["prefix_router.cache_hit_ratio"] == round(cached / prompt, 4)
        assert "prefix_router.cached_tokens.predicted" not in a  # policy prefix keeps no index
        assert a["prefix_router.attempts"] == len(attempts)
        assert a["prefix_router.retries"] == len(attempts) - 1
        assert [s.attributes["prefix_router.attempt"] for s in attempts] == \
            list(range(1, len(attempts) + 1))
        assert attempts[-1].attributes["http.response.status_code"] == 200
        assert attempts[-1].attributes["prefix_router.replica"] == a["prefix_router.replica"]
        if len(attempts) > 1:
            retried += 1
            first, second = attempts[0], attempts[1]
            assert first.attributes["prefix_router.replica"] == "r1"  # the killed one
            assert first.status == "ERROR" and "http.response.status_code" not in \
                first.attributes
            reason = first.attributes["error.type"]
            assert a["prefix_router.retry_reasons"] == [reason]
            assert second.attributes["http.request.resend_count"] == 1
            assert second.events == (("prefix_router.retry", {
                "prefix_router.retry.reason": reason,
                "prefix_router.retry.previous_replica": "r1"}),)
    assert retried >= 1, "no request was homed on the killed replica"
    assert any(cached > 0 for _, cached in sent.values()), "no request hit the cache"


def test_cache_aware_spans_carry_predicted_and_reported_cached_tokens(
        router_server: Any, receiver: OtlpReceiver) -> None:
    fleet_mod = pytest.importorskip("loadtest.fleet")
    with fleet_mod.Fleet(replicas=2, speed=50.0) as sim:
        srv, _ = router_server(traced(list(sim.urls), receiver,
                                      routing={"policy": "cache_aware"}))
        c = client(srv.url, timeout=30)
        system = SYSTEM + " Cite the order policy in full. " * 20
        traces = []
        for stream in (False, True):
            header, trace_id, _ = traceparent()
            traces.append((trace_id, ask_sim(c, system, stream, header)))
        spans = receiver.wait_for(lambda s: all(complete(s, t) for t, _ in traces),
                                  "both requests' spans")
    (first, _), (second, (prompt, cached)) = traces
    a = server_and_attempts(spans, first)[0].attributes
    assert a["prefix_router.policy"] == "cache_aware"
    assert a["prefix_router.cached_tokens.predicted"] == 0  # nothing indexed yet
    b = server_and_attempts(spans, second)[0].attributes
    assert b["prefix_router.replica"] == a["prefix_router.replica"]
    assert cached > 0 and b["prefix_router.cached_tokens.reported"] == cached
    assert 0 < b["prefix_router.cached_tokens.predicted"] <= prompt
    assert b["gen_ai.response.time_to_first_chunk"] > 0  # the second was streamed


def test_a_client_that_leaves_mid_stream_is_on_the_span(
        fake_fleet: Any, router_server: Any, receiver: OtlpReceiver) -> None:
    fleet: Fleet = fake_fleet(1)
    srv, _ = router_server(traced(fleet.urls, receiver))
    header, trace_id, _ = traceparent()
    stream = client(srv.url).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "a long answer"}], stream=True,
        extra_headers={"x-fake-chunks": "50", "x-fake-chunk-delay": "0.05",
                       "traceparent": header})
    next(iter(stream))
    stream.close()
    spans = receiver.wait_for(lambda s: complete(s, trace_id), "the request's spans")
    server, (attempt,) = server_and_attempts(spans, trace_id)
    assert server.attributes["prefix_router.client_disconnected"] is True
    assert server.attributes["http.response.status_code"] == 200  # what had been sent
    assert attempt.attributes["error.type"] == "cancelled"


def test_tracing_off_imports_no_opentelemetry(tmp_path: Any) -> None:
    """The hot path with tracing off, in a fresh interpreter: start the app, route a request
    (to a replica that is not there), stop - and no opentelemetry module was ever loaded."""
    script = """
import asyncio, sys
from router.app import create_app
from router.settings import Settings
from loadtest._net import quiet_port

async def main():
    app = create_app(Settings.from_dict({
        "replicas": [{"name": "r0", "url": f"http://127.0.0.1:{quiet_port()}"}],
        "logging": {"access_log": False}}))
    await app.startup()
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    sent = []
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}
    async def send(msg):
        sent.append(msg)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "query_string": b"",
             "headers": [(b"content-type", b"application/json"),
                         (b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")]}
    await app(scope, receive, send)
    await app.shutdown()
    print(sent[0]["status"], sorted(m for m in sys.modules if m.startswith("opentelemetry")))

asyncio.run(main())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, env=env, cwd=os.getcwd(), check=True).stdout.split()
    assert out == ["503", "[]"], out
