"""Prefill/decode disaggregation end to end: the router in front of simulated vLLM replicas that
play vLLM's NixlConnector protocol (``--kv-transfer-config``), real HTTP on 127.0.0.1.

Covers the two phases (streamed and not, through the official openai client), the prefill's
retry on another prefill instance, a failing decode instance (never retried), a client that
leaves during each phase, a fleet whose last decode instance goes down (503) and role changes
published by discovery.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtest.replica import Replica, ReplicaConfig
from router.app import RouterApp, create_app
from router.disagg import PREFILL_PARAMS, decode_body, prefill_body
from router.discovery import Endpoint, Publish
from router.roles import Role
from router.settings import Settings
from tests.conftest import ThreadedServer, wait_for

KV = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
SYSTEM = "You are the support assistant of the ACME billing platform. Cite the policy. " * 12
HTTP = httpx.Client(timeout=30)


def messages(user: str = "How do I reset my password?") -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


class Sims:
    """Simulated replicas by name, each a ThreadedServer; stopped at the end of the test."""

    def __init__(self) -> None:
        self.servers: dict[str, ThreadedServer] = {}

    def start(self, name: str, **options: Any) -> str:
        options.setdefault("speed", 20.0)
        options.setdefault("kv_transfer_config", KV)
        srv = ThreadedServer(Replica(ReplicaConfig(name=name, **options))).start()
        self.servers[name] = srv
        return srv.url

    def url(self, name: str) -> str:
        return self.servers[name].url

    def stats(self, name: str) -> dict[str, Any]:
        return HTTP.get(self.url(name) + "/admin/stats").json()  # type: ignore[no-any-return]

    def fault(self, name: str, **spec: Any) -> None:
        assert HTTP.post(self.url(name) + "/admin/fault", json=spec).status_code == 200

    def stop(self) -> None:
        for srv in self.servers.values():
            srv.stop()


@pytest.fixture
def sims() -> Iterator[Sims]:
    s = Sims()
    yield s
    s.stop()


class Membership:
    """A discovery source the test drives: `publish` hands the router a new membership."""

    def __init__(self) -> None:
        self._publish: Publish | None = None

    async def run(self, publish: Publish) -> None:
        self._publish = publish
        await asyncio.Event().wait()

    def publish(self, endpoints: list[Endpoint]) -> None:
        assert self._publish is not None
        self._publish(endpoints)


def settings(replicas: list[dict[str, Any]], **extra: Any) -> Settings:
    return Settings.from_dict({
        "replicas": replicas, "health": {"interval": 0.1, "timeout": 0.5,
                                         "readmit_backoff": 0.2},
        "scrape": {"interval": 0.2}, "logging": {"access_log": False}, **extra})


@pytest.fixture
def router() -> Iterator[Callable[..., tuple[str, RouterApp]]]:
    started: list[ThreadedServer] = []

    def start(s: Settings, discovery: Any = None) -> tuple[str, RouterApp]:
        app = create_app(s, discovery=discovery)
        srv = ThreadedServer(app).start()
        started.append(srv)
        APPS[srv.url] = app
        return srv.url, app

    yield start
    for srv in reversed(started):
        srv.stop()


def disagg_fleet(sims: Sims, prefill: int = 2, decode: int = 2,
                 **options: dict[str, Any]) -> list[dict[str, Any]]:
    """``prefill`` + ``decode`` simulated replicas (p0.., d0..); ``options``: a replica's own
    config by name."""
    out = []
    for i in range(prefill):
        out.append({"name": f"p{i}", "url": sims.start(f"p{i}", **options.get(f"p{i}", {})),
                    "role": "prefill"})
    for i in range(decode):
        out.append({"name": f"d{i}", "url": sims.start(f"d{i}", **options.get(f"d{i}", {})),
                    "role": "decode"})
    return out


APPS: dict[str, RouterApp] = {}  # router URL -> its app (for `metric`)


def metric(url: str, name: str, **labels: str) -> float:
    """A metric of the router at ``url``, summed over the label sets matching ``labels``, read
    once the router has no request open: the client can have the last byte before the router
    counted the outcome."""
    app = APPS.get(url)
    if app is not None:
        wait_for(lambda: app._open == 0, "the router's requests to end")
    text = HTTP.get(url + "/metrics").text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def client(url: str) -> Any:  # Any: the assertions read optional response fields
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)


def test_the_phase_bodies_are_vllm_toy_proxys() -> None:
    parsed = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
              "stream_options": {"include_usage": True}, "max_tokens": 50,
              "max_completion_tokens": 50, "min_tokens": 2, "kv_transfer_params": {"x": 1}}
    first = json.loads(prefill_body(parsed))
    assert first == {"model": "m", "messages": [{"role": "user", "content": "x"}],
                     "stream": False, "max_tokens": 1, "max_completion_tokens": 1,
                     "kv_transfer_params": dict(PREFILL_PARAMS)}
    assert PREFILL_PARAMS == {"do_remote_decode": True, "do_remote_prefill": False,
                              "remote_engine_id": None, "remote_block_ids": None,
                              "remote_host": None, "remote_port": None}
    second = json.loads(decode_body(parsed, {"do_remote_prefill": True}))
    assert second == {**parsed, "kv_transfer_params": {"do_remote_prefill": True}}
    assert "kv_transfer_params" not in json.loads(decode_body(parsed, None))


def test_two_phases_streamed_and_not(sims: Sims, router: Callable[..., Any]) -> None:
    url, _ = router(settings(disagg_fleet(sims)))
    c = client(url)
    raw = c.chat.completions.with_raw_response.create(model="sim-model", messages=messages(),
                                                      max_tokens=6)
    done = raw.parse()
    assert raw.headers["x-prefix-router-replica"] in ("d0", "d1")
    prompt = done.usage.prompt_tokens
    assert done.usage.prompt_tokens_details.cached_tokens == 0  # the prefill's (cold) hit
    assert done.choices[0].message.content and done.usage.completion_tokens == 6
    decoded = [metric(sims.url(n), "vllm:external_prefix_cache_hits_total") for n in ("d0", "d1")]
    assert sorted(decoded) == [0, prompt - 1]  # the KV came over: all but one token
    prefilled = {n: sims.stats(n) for n in ("p0", "p1")}
    first = next(n for n, st in prefilled.items() if st["prefix_cache_queries"])
    assert prefilled[first]["prefix_cache_queries"] == prompt
    # the same conversation streamed: its prefill goes back to the instance that holds it
    with c.chat.completions.with_streaming_response.create(
            model="sim-model", messages=messages(), max_tokens=6, stream=True,
            stream_options={"include_usage": True}) as resp:
        decoded_by = resp.headers["x-prefix-router-replica"]
        chunks = list(resp.parse())
    assert decoded_by in ("d0", "d1")
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text.split() == done.choices[0].message.content.split()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    st = sims.stats(first)
    assert st["prefix_cache_hits"] == (prompt - 1) // 16 * 16  # a prefix-cache hit on prefill
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == st["prefix_cache_hits"]
    assert sum(sims.stats(n)["requests"] for n in ("d0", "d1")) == 2
    assert metric(url, "prefix_router_disagg_requests_total", outcome="ok") == 2
    assert metric(url, "prefix_router_requests_total", branch="cache_hit", replica=first) == 1
    assert metric(url, "prefix_router_requests_total", branch="decode_load") == 2
    assert metric(url, "prefix_router_disagg_phase_seconds_count", phase="prefill") == 2
    assert metric(url, "prefix_router_disagg_phase_seconds_count",
                  phase="transfer_first_token") == 2
    assert metric(url, "prefix_router_disagg_time_to_first_byte_seconds_count") == 2


def test_completions_are_disaggregated_too(sims: Sims, router: Callable[..., Any]) -> None:
    url, _ = router(settings(disagg_fleet(sims, 1, 1)))
    r = HTTP.post(url + "/v1/completions", json={"model": "sim-model", "prompt": SYSTEM,
                                                 "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert r.headers["x-prefix-router-replica"] == "d0"
    usage = r.json()["usage"]
    assert metric(sims.url("d0"), "vllm:external_prefix_cache_hits_total") == \
        usage["prompt_tokens"] - 1


def test_a_failed_prefill_retries_on_another_prefill_instance(
        sims: Sims, router: Callable[..., Any]) -> None:
    fleet = disagg_fleet(sims, p0={"fault_error_rate": 1.0})
    url, _ = router(settings(fleet, health={"eject_after": 100}))
    c = client(url)
    for i in range(12):  # unrelated prompts until one was placed on the failing p0 first
        done = c.chat.completions.create(model="sim-model", max_tokens=2, messages=[
            {"role": "user", "content": f"unrelated question {i} " * 60}])
        assert done.usage.completion_tokens == 2
        if sims.stats("p0")["requests"]:
            break
    assert sims.stats("p0")["requests"] >= 1
    assert metric(url, "prefix_router_retries_total", replica="p0", reason="status_500") >= 1
    assert metric(url, "prefix_router_disagg_requests_total", outcome="ok") == i + 1
    assert sims.stats("p1")["requests"] == i + 1


def test_the_last_prefill_failure_is_relayed(sims: Sims, router: Callable[..., Any]) -> None:
    fleet = disagg_fleet(sims, 1, 1, p0={"fault_error_rate": 1.0, "fault_error_status": 500})
    url, _ = router(settings(fleet, health={"eject_after": 100}))
    r = HTTP.post(url + "/v1/chat/completions", json={"model": "sim-model",
                                                      "messages": messages()})
    assert r.status_code == 500 and r.json()["message"] == "injected fault"
    assert sims.stats("d0")["requests"] == 0
    assert metric(url, "prefix_router_disagg_requests_total", outcome="prefill_failed") == 1


def test_a_failing_decode_is_not_retried(sims: Sims, router: Callable[..., Any]) -> None:
    url, _ = router(settings(disagg_fleet(sims), health={"eject_after": 100}))
    for name in ("d0", "d1"):
        sims.fault(name, error_rate=1.0, error_status=503)
    r = HTTP.post(url + "/v1/chat/completions", json={"model": "sim-model",
                                                      "messages": messages(), "stream": True})
    assert r.status_code == 503, r.text
    assert sum(sims.stats(n)["requests"] for n in ("d0", "d1")) == 1  # never a second decode
    assert sum(sims.stats(n)["requests"] for n in ("p0", "p1")) == 1
    assert metric(url, "prefix_router_disagg_requests_total", outcome="decode_failed") == 1
    # an unreachable decode instance: the router's own 503, in OpenAI format
    sims.servers["d0"].stop()
    sims.servers["d1"].stop()
    r = HTTP.post(url + "/v1/chat/completions", json={"model": "sim-model",
                                                      "messages": messages("other")})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "no_replica_available"


def test_client_leaving_during_prefill_aborts_it(sims: Sims, router: Callable[..., Any]) -> None:
    # a slow prefill (about two seconds of engine time), a client that waits 0.5 s
    fleet = disagg_fleet(sims, 1, 1, p0={"speed": 1.0, "fault_slow": 60.0})
    url, _ = router(settings(fleet))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/chat/completions", timeout=0.5,
                   json={"model": "sim-model", "messages": messages(), "stream": True})
    wait_for(lambda: sims.stats("p0")["aborts"] == 1, "the prefill instance to abort")
    wait_for(lambda: metric(url, "prefix_router_disagg_requests_total",
                            outcome="client_closed") == 1, "the outcome")
    assert sims.stats("d0")["requests"] == 0  # the decode phase never started


def test_client_leaving_during_decode_aborts_it(sims: Sims, router: Callable[..., Any]) -> None:
    fleet = disagg_fleet(sims, 1, 1, d0={"speed": 1.0, "fault_slow": 5.0})
    url, _ = router(settings(fleet))
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=30,
                      json={"model": "sim-model", "messages": messages(), "stream": True,
                            "max_tokens": 500}) as resp:
        assert resp.headers["x-prefix-router-replica"] == "d0"
        next(resp.iter_bytes())  # the first decode chunk, then the client leaves
    wait_for(lambda: sims.stats("d0")["aborts"] == 1, "the decode instance to abort")
    wait_for(lambda: metric(url, "prefix_router_disagg_requests_total",
                            outcome="client_closed") == 1, "the outcome")
    assert sims.stats("p0")["requests"] == 1 and sims.stats("p0")["aborts"] == 0


def test_losing_the_last_decode_instance_answers_503(
        sims: Sims, router: Callable[..., Any]) -> None:
    url, app = router(settings(disagg_fleet(sims, 2, 1)))
    ok = HTTP.post(url + "/v1/chat/completions", json={"model": "sim-model",
                                                       "messages": messages()})
    assert ok.status_code == 200
    sims.fault("d0", health_status=500)  # vLLM's /health once its engine died
    d0 = app.replicas.get("d0")
    assert d0 is not None
    wait_for(lambda: not d0.healthy, "the router to eject d0")
    before = sum(sims.stats(n)["requests"] for n in ("p0", "p1"))
    r = HTTP.post(url + "/v1/chat/completions", json={"model": "sim-model",
                                                      "messages": messages()})
    assert r.status_code == 503
    assert r.json()["error"] == {"message": "no decode instance available",
                                 "type": "server_error", "param": None,
                                 "code": "no_replica_available"}
    assert r.headers["retry-after"] == "1"
    assert sum(sims.stats(n)["requests"] for n in ("p0", "p1")) == before  # no prefill wasted
    assert metric(url, "prefix_router_disagg_requests_total", outcome="no_decode") == 1


def test_role_changes_by_discovery(sims: Sims, router: Callable[..., Any]) -> None:
    urls = {n: sims.start(n) for n in ("a", "b")}
    members = Membership()
    s = settings([{"name": n, "url": u} for n, u in urls.items()])
    url, app = router(s, members)
    body = {"model": "sim-model", "messages": messages(), "max_tokens": 2}

    def ask() -> httpx.Response:
        r = HTTP.post(url + "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return r

    def publish(roles: dict[str, Role]) -> None:
        loop = app_loop(app)
        loop.call_soon_threadsafe(members.publish, [
            Endpoint(n, u, role=roles.get(n, Role.BOTH)) for n, u in urls.items()])
        wait_for(lambda: {n: app.replicas.get(n).role for n in urls} ==  # type: ignore[union-attr]
                 {n: roles.get(n, Role.BOTH) for n in urls}, "the membership")

    ask()  # colocated: both serve both, one of them answers the whole request
    assert sum(sims.stats(n)["requests"] for n in urls) == 1
    publish({"a": Role.PREFILL, "b": Role.DECODE})
    r = ask()
    assert r.headers["x-prefix-router-replica"] == "b"
    assert (sims.stats("a")["requests"], sims.stats("b")["requests"]) in ((2, 1), (1, 2))
    assert metric(url, "prefix_router_disagg_requests_total", outcome="ok") == 1
    publish({"a": Role.DECODE, "b": Role.PREFILL})  # swapped
    assert ask().headers["x-prefix-router-replica"] == "a"
    assert metric(url, "prefix_router_disagg_requests_total", outcome="ok") == 2
    publish({"a": Role.PREFILL})  # no decode role left: served as before, in one phase
    before = {n: sims.stats(n)["requests"] for n in urls}
    ask()
    after = {n: sims.stats(n)["requests"] for n in urls}
    assert sum(after.values()) - sum(before.values()) == 1
    assert metric(url, "prefix_router_disagg_requests_total", outcome="ok") == 2


def app_loop(app: RouterApp) -> asyncio.AbstractEventLoop:
    """The event loop the router app runs on (its lifespan tasks live there)."""
    task = app._tasks[0]  # the discovery task
    return task.get_loop()


def test_time_to_first_byte_is_both_phases(sims: Sims, router: Callable[..., Any]) -> None:
    url, _ = router(settings(disagg_fleet(sims, 1, 1)))
    r = HTTP.post(url + "/v1/chat/completions", json={"model": "sim-model",
                                                      "messages": messages()})
    assert r.status_code == 200
    first = metric(url, "prefix_router_disagg_time_to_first_byte_seconds_sum")
    prefill = metric(url, "prefix_router_disagg_phase_seconds_sum", phase="prefill")
    decode = metric(url, "prefix_router_disagg_phase_seconds_sum", phase="transfer_first_token")
    assert first == pytest.approx(prefill + decode)
    assert 0 < prefill < first


def test_traces_tag_each_phase(sims: Sims, router: Callable[..., Any],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    pytest.importorskip("opentelemetry.proto", reason="opentelemetry-proto is not installed")
    from tests.otlp import OtlpReceiver

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    with OtlpReceiver() as rx:
        url, _ = router(settings(disagg_fleet(sims, 1, 1),
                                 tracing={"enabled": True, "endpoint": rx.endpoint}))
        r = HTTP.post(url + "/v1/chat/completions", json={"model": "sim-model",
                                                          "messages": messages()})
        assert r.status_code == 200
        spans = rx.wait_for(lambda got: sum(s.kind == "CLIENT" for s in got) == 2
                            and any(s.kind == "SERVER" for s in got), "the request's spans")
    attempts = sorted((s for s in spans if s.kind == "CLIENT"),
                      key=lambda s: s.attributes["prefix_router.attempt"])
    assert [(s.attributes["prefix_router.phase"], s.attributes["prefix_router.replica"])
            for s in attempts] == [("prefill", "p0"), ("decode", "d0")]
    server = next(s for s in spans if s.kind == "SERVER")
    assert server.attributes["prefix_router.prefill_ms"] > 0
    assert server.attributes["prefix_router.replica"] == "d0"


def test_a_slow_prefill_phase_times_out(sims: Sims, router: Callable[..., Any]) -> None:
    fleet = disagg_fleet(sims, 1, 1, p0={"speed": 1.0, "fault_slow": 60.0})
    url, _ = router(settings(fleet, disagg={"prefill_timeout": 0.3}))
    r = HTTP.post(url + "/v1/chat/completions", json={"model": "sim-model",
                                                      "messages": messages()})
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "upstream_timeout"
    assert "disagg.prefill_timeout" in r.json()["error"]["message"]
    wait_for(lambda: sims.stats("p0")["aborts"] == 1, "the prefill instance to abort")
    assert sims.stats("d0")["requests"] == 0
    assert metric(url, "prefix_router_disagg_requests_total", outcome="timeout") == 1


def test_a_prefill_answer_over_the_limit_is_a_502(sims: Sims, router: Callable[..., Any]) -> None:
    url, _ = router(settings(disagg_fleet(sims, 1, 1),
                             disagg={"max_prefill_response": 200}))
    r = HTTP.post(url + "/v1/chat/completions", json={"model": "sim-model",
                                                      "messages": messages()})
    assert r.status_code == 502 and "disagg.max_prefill_response" in r.json()["error"]["message"]
    assert sims.stats("d0")["requests"] == 0
    assert metric(url, "prefix_router_disagg_requests_total", outcome="prefill_failed") == 1


def test_other_endpoints_are_served_in_one_phase(sims: Sims, router: Callable[..., Any]) -> None:
    url, _ = router(settings(disagg_fleet(sims, 1, 1)))
    r = HTTP.post(url + "/v1/embeddings", json={"model": "sim-model", "input": "hello there"})
    assert r.status_code == 404  # the simulator serves no embeddings: one replica answered
    assert r.headers["x-prefix-router-replica"] in ("p0", "d0")
    assert metric(url, "prefix_router_disagg_requests_total") == 0
    assert metric(url, "prefix_router_requests_total", branch="decode_load") == 0
    assert metric(url, "prefix_router_requests_total") == 1
