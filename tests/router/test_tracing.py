"""router.tracing without a network: spans go to the SDK's in-memory exporter."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from yarl import URL

from router.accesslog import AccessRecord
from router.app import start_tracing
from router.settings import Settings, SettingsError, TracingSettings
from router.tracing import ATTRIBUTES, Tracing

SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
         "client": ("10.1.2.3", 5555), "http_version": "1.1", "scheme": "http"}


def run_one(tracing: Tracing, *, attempts: list[tuple[int | None, float | None, str | None]]
            ) -> list[list[tuple[str, str]]]:
    """One request through a RequestTrace: the attempts' (status, ttfb_ms, failure)."""
    record = AccessRecord("POST", "/v1/chat/completions")
    trace = tracing.request(SCOPE, record)
    sent = []
    for i, (status, ttfb, failure) in enumerate(attempts):
        url = URL(f"http://10.0.0.{i}:8000/v1/chat/completions")
        sent.append(trace.attempt(f"r{i}", url, "POST", [("traceparent", "00-bad"),
                                                         ("x-keep", "1")]))
        trace.attempt_end(status, ttfb, failure, i < len(attempts) - 1)
        record.replica, record.status = f"r{i}", status or 0
    trace.finish(record)
    return sent


@pytest.mark.parametrize(("env", "yaml", "expected"), [
    ({}, None, "prefix-router"),                                    # our fallback
    ({"OTEL_SERVICE_NAME": "gateway"}, None, "gateway"),           # the standard variable
    ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=edge"}, None, "edge"),
    ({"OTEL_SERVICE_NAME": "gateway"}, "from-yaml", "from-yaml"),  # the file wins
])
def test_service_name_precedence(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                 yaml: str | None, expected: str) -> None:
    for k in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    t = Tracing(TracingSettings(enabled=True, service_name=yaml), "prefix",
                exporter=InMemorySpanExporter())
    assert t.provider.resource.attributes["service.name"] == expected
    t.shutdown()


def test_a_retried_request_and_its_headers() -> None:
    memory = InMemorySpanExporter()
    t = Tracing(TracingSettings(enabled=True), "prefix", exporter=memory)
    sent = run_one(t, attempts=[(None, None, "connect"), (503, None, "status_503"),
                                (200, 12.5, None)])
    t.shutdown()
    spans = {s.name + str(s.attributes.get("prefix_router.attempt", "")): s
             for s in memory.get_finished_spans()}
    server = spans["POST /v1/chat/completions"]
    assert server.attributes["prefix_router.retry_reasons"] == ("connect", "status_503")
    assert server.attributes["prefix_router.attempts"] == 3
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["client.address"] == "10.1.2.3"
    third = spans["POST /v1/chat/completions3"]
    assert third.attributes["http.request.resend_count"] == 2
    assert third.events[0].attributes["prefix_router.retry.reason"] == "status_503"
    assert third.events[0].attributes["prefix_router.retry.previous_replica"] == "r1"
    assert spans["POST /v1/chat/completions2"].attributes["error.type"] == "status_503"
    for headers, span_no in zip(sent, (1, 2, 3), strict=True):
        span = spans[f"POST /v1/chat/completions{span_no}"]
        tp = dict(headers)["traceparent"]
        assert tp == f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-03"
        assert ("x-keep", "1") in headers and len(headers) == 2  # the client's traceparent gone
    used = {k for s in memory.get_finished_spans() for k in s.attributes}
    assert used <= set(ATTRIBUTES), used - set(ATTRIBUTES)  # every name is documented


def test_sample_ratio_zero_records_nothing_but_still_propagates() -> None:
    memory = InMemorySpanExporter()
    t = Tracing(TracingSettings(enabled=True, sample_ratio=0.0), "prefix", exporter=memory)
    (headers,) = run_one(t, attempts=[(200, 1.0, None)])
    t.shutdown()
    assert memory.get_finished_spans() == ()
    assert dict(headers)["traceparent"].endswith("-02")  # not sampled: vLLM records none either


@pytest.mark.parametrize(("env", "error"), [
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "expected http/protobuf | grpc"),
])
def test_exporter_protocol_errors(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                  error: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError, match=error):
        Tracing(TracingSettings(enabled=True), "prefix")


@pytest.mark.parametrize(("doc", "env", "on"), [
    ({}, {}, False),                                         # off by default
    ({"enabled": True}, {}, True),
    ({"enabled": True}, {"OTEL_SDK_DISABLED": "true"}, False),  # the standard kill switch
])
def test_start_tracing(doc: dict[str, Any], env: dict[str, str], on: bool) -> None:
    tracing = start_tracing(Settings.from_dict({"tracing": doc}), env)
    assert (tracing is not None) is on
    if tracing is not None:
        tracing.shutdown()


def test_the_guide_documents_every_attribute() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "guide.md").read_text()
    section = readme.split("## Traces (OpenTelemetry)", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip().strip("`") for line in section.splitlines()
            if line.startswith("| `")}
    assert rows == set(ATTRIBUTES)
