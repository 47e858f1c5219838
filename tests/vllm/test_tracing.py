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

pytestmark = pytest.mark.vllm

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


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_span_is_the_child_of_the_router_attempt(
        traced_fleet: VllmFleet, receiver: OtlpReceiver, openai_client: Any,
        monkeypatch: pytest.MonkeyPatch, unique: str, stream: bool) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    settings = router_settings(traced_fleet, tracing={"enabled": True,
                                                      "endpoint": receiver.endpoint})
    from router.app import create_app

    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    with ThreadedServer(create_app(settings)) as server:
        c = openai_client(server.url)
        msgs = [{"role": "system", "content": f"{unique} You answer in one short sentence. " * 8},
                {"role": "user", "content": "Say hello."}]
        headers = {"traceparent": f"00-{trace_id}-{parent}-01"}
        if stream:
            list(c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, stream=True,
                                           stream_options={"include_usage": True},
                                           extra_headers=headers))
        else:
            c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8,
                                      extra_headers=headers)

        def complete(spans: list[ReceivedSpan]) -> bool:
            mine = [s for s in spans if s.trace_id == trace_id]
            return {"SERVER", "CLIENT"} <= {s.kind for s in mine if
                                           s.resource.get("service.name") == "prefix-router"} \
                and any(s.resource.get("service.name") == "vllm" for s in mine)

        spans = receiver.wait_for(complete, "router and vLLM spans of one trace", timeout=60)
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
    assert server.attributes["prefix_router.replica"] == traced_fleet.names[0]
    assert server.attributes["http.response.status_code"] == 200
