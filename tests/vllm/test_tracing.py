"""Real vLLM: one trace from the client through the router into vLLM's own span.

A vLLM replica started with ``--otlp-traces-endpoint`` (OTLP/HTTP) and the router with tracing
on export to the same in-test OTLP receiver (tests/otlp.py). vLLM reads the ``traceparent`` the
router sends, so its ``llm_request`` span must be the child of the router's attempt span, in
the client's trace.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from loadtest.vllm_fleet import VllmEnv, VllmFleet
from tests.conftest import ThreadedServer
from tests.vllm.conftest import MODEL, router_settings

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
pytest.importorskip("opentelemetry.proto", reason="opentelemetry-proto is not installed")

from tests.otlp import OtlpReceiver, ReceivedSpan  # noqa: E402


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def traced_fleet(vllm_env: VllmEnv, receiver: OtlpReceiver,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmFleet]:
    """One replica of its own: the session fleet runs without tracing."""
    fleet = VllmFleet(n=1, model_dir=vllm_env.model_dir, venv=vllm_env.venv, block_size=32,
                      served_model_name=MODEL, log_dir=tmp_path_factory.mktemp("vllm-traced"),
                      extra_args=["--otlp-traces-endpoint", receiver.endpoint],
                      extra_env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                                 "OTEL_SERVICE_NAME": "vllm", "OTEL_BSP_SCHEDULE_DELAY": "100"})
    with fleet:
        yield fleet


def test_vllm_span_is_the_child_of_the_router_attempt(
        traced_fleet: VllmFleet, receiver: OtlpReceiver, openai_client: Any,
        monkeypatch: pytest.MonkeyPatch, unique: str) -> None:
    """The same prompt twice, non-streamed then streamed: both traces run client -> router
    SERVER -> attempt CLIENT -> vLLM llm_request, and the router's span carries the usage vLLM
    reported (the second request's prefix is in vLLM's cache by then)."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    settings = router_settings(traced_fleet, tracing={"enabled": True,
                                                      "endpoint": receiver.endpoint})
    from router.app import create_app

    msgs = [{"role": "system", "content": f"{unique} You answer in one short sentence. " * 8},
            {"role": "user", "content": "Say hello."}]
    sent: list[tuple[str, str, Any]] = []
    with ThreadedServer(create_app(settings)) as server:
        c = openai_client(server.url)
        for stream in (False, True):
            trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
            headers = {"traceparent": f"00-{trace_id}-{parent}-01"}
            if stream:
                chunks = list(c.chat.completions.create(
                    model=MODEL, messages=msgs, max_tokens=8, stream=True,
                    stream_options={"include_usage": True}, extra_headers=headers))
                usage = chunks[-1].usage
            else:
                usage = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8,
                                                  extra_headers=headers).usage
            sent.append((trace_id, parent, usage))

        def complete(spans: list[ReceivedSpan]) -> bool:
            for trace_id, _, _ in sent:
                mine = [s for s in spans if s.trace_id == trace_id]
                names = {(s.resource.get("service.name"), s.kind) for s in mine}
                if not {("prefix-router", "SERVER"), ("prefix-router", "CLIENT")} <= names \
                        or not any(n == "vllm" for n, _ in names):
                    return False
            return True

        spans = receiver.wait_for(complete, "router and vLLM spans of both traces", timeout=60)
    for trace_id, parent, usage in sent:
        mine = [s for s in spans if s.trace_id == trace_id]
        (server,) = [s for s in mine if s.kind == "SERVER"
                     and s.resource.get("service.name") == "prefix-router"]
        (attempt,) = [s for s in mine if s.kind == "CLIENT"]
        vllm = [s for s in mine if s.resource.get("service.name") == "vllm"]
        assert server.parent_span_id == parent
        assert attempt.parent_span_id == server.span_id
        assert [s.parent_span_id for s in vllm] == [attempt.span_id], vllm
        (request,) = vllm
        assert request.name == "llm_request"
        a = server.attributes
        assert a["prefix_router.replica"] == traced_fleet.names[0]
        assert a["http.response.status_code"] == 200
        # what vLLM reported, three ways: to the client, on its own span, on the router's
        assert a["gen_ai.usage.input_tokens"] == usage.prompt_tokens == \
            request.attributes["gen_ai.usage.prompt_tokens"]
        cached = usage.prompt_tokens_details.cached_tokens or 0
        assert a["gen_ai.usage.cache_read.input_tokens"] == cached
    assert sent[1][2].prompt_tokens_details.cached_tokens > 0  # the repeat hit the cache
