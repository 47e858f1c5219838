"""OpenTelemetry traces of routed requests: one SERVER span per /v1 request, one CLIENT span per
upstream attempt, W3C Trace Context continued from the client and handed to the replica.

Only imported when `tracing.enabled` is true (it needs the `otel` extra: opentelemetry-sdk and
the OTLP/HTTP exporter). With tracing off the app holds ``tracing = None``: a request costs one
attribute test, then its trace is a local None that the app tests three times and the proxy
twice per attempt; nothing here or in opentelemetry is imported.

Trace shape, for a client that sent ``traceparent: 00-T-P-01``:

    client span P (trace T)
    └── SERVER "POST /v1/chat/completions" (the router; routing decision, usage, outcome)
        ├── CLIENT "POST /v1/chat/completions" attempt 1 on r1 (error.type=connect)
        └── CLIENT "POST /v1/chat/completions" attempt 2 on r2, event prefix_router.retry
            └── vLLM's own span (the upstream request carried this attempt's traceparent)

Without a valid ``traceparent`` the SERVER span is the root of a new trace. An incoming
``traceparent``/``tracestate`` is replaced upstream by the attempt's (W3C Trace Context only;
other headers, ``baggage`` included, pass through untouched).

Attribute names are API, listed in `ATTRIBUTES` (and in docs/guide.md's table); they follow the OTel
HTTP semantic conventions and the GenAI conventions where those define one, and use the
``prefix_router.`` namespace otherwise. Never recorded: prompt or completion text, headers,
bodies; routing-key values (a prefix digest, a session id, the body's ``user``) only with
`tracing.record_routing_keys`.

Spans are started and ended explicitly with their parent passed in (no context variables are
attached), and exported by the SDK's BatchSpanProcessor from its own thread; the sampler, the
resource and the exporter read the standard OTEL_* variables (`TracingSettings` says which value
wins). Cost per request with tracing on: two span starts and ends, a few dozen attribute sets and
one traceparent format per attempt on the event loop, plus OTLP encoding in the export thread
(docs/benchmarks.md measures it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from router.accesslog import CLIENT_CLOSED, AccessRecord
from router.settings import DEFAULT_SERVICE_NAME, SettingsError, TracingSettings
from router.usage import Usage

__all__ = ["ATTRIBUTES", "RequestTrace", "Tracing", "operation_name"]

# name -> what it holds; on the SERVER span (S) and/or the attempt CLIENT spans (C)
ATTRIBUTES: dict[str, str] = {
    "http.request.method": "S C: the HTTP method",
    "url.path": "S: the request path (never the query string)",
    "url.scheme": "S: http or https",
    "http.route": "S: the /v1 endpoint",
    "network.protocol.version": "S: HTTP version of the client connection",
    "client.address": "S: the client's address as the router saw it",
    "http.response.status_code": "S C: the status sent to the client / answered by the replica",
    "error.type": "S C: the failure reason (retry vocabulary) or status code of a failed span",
    "server.address": "C: the replica's host",
    "server.port": "C: the replica's port",
    "url.full": "C: the upstream URL (without the query string)",
    "http.request.resend_count": "C: 1 on the second attempt, 2 on the third...",
    "gen_ai.operation.name": "S: chat, text_completion or embeddings",
    "gen_ai.request.model": "S: the body's model",
    "gen_ai.usage.input_tokens": "S: usage.prompt_tokens reported by the replica",
    "gen_ai.usage.cache_read.input_tokens": "S: usage.prompt_tokens_details.cached_tokens",
    "gen_ai.response.time_to_first_chunk": "S: streamed requests: seconds to the first chunk",
    "prefix_router.policy": "S: routing.policy",
    "prefix_router.branch": "S: the branch that decided (the metrics' branch label)",
    "prefix_router.key_source": "S: header, prefix, conversation or none",
    "prefix_router.replica": "S C: the replica that answered / that this attempt went to",
    "prefix_router.home_replica": "S: the key's home replica, when the policy has one",
    "prefix_router.stream": "S: whether the body asked for a stream",
    "prefix_router.attempts": "S: upstream attempts made",
    "prefix_router.retries": "S: attempts that were retried",
    "prefix_router.retry_reasons": "S: the reason of each retry, in order",
    "prefix_router.attempt": "C: this attempt's number, from 1",
    "prefix_router.phase": "C: a disaggregated request's phase: prefill or decode",
    "prefix_router.prefill_ms": "S: a disaggregated request: ms its prefill phase took",
    "prefix_router.ttft_ms": "S C: ms from dispatch to the replica's first body byte",
    "prefix_router.cached_tokens.predicted":
        "S: policy cache_aware: cached tokens the prefix index expected on the replica that served",
    "prefix_router.cached_tokens.reported": "S: cached tokens the replica reported (as above)",
    "prefix_router.cache_hit_ratio": "S: reported cached tokens / prompt tokens, 0..1 (1 = all cached)",
    "prefix_router.client_disconnected": "S: the client went away before the response ended",
    "prefix_router.key.prefix": "S: the prefix digest (only with record_routing_keys)",
    "prefix_router.key.conversation": "S: the conversation id (only with record_routing_keys)",
}
RETRY_EVENT = "prefix_router.retry"  # on attempt 2..n: prefix_router.retry.reason, .previous_replica

_OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion",
               "/v1/embeddings": "embeddings"}
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_HEADERS = (b"traceparent", b"tracestate")
_TRACE_HEADER_NAMES = frozenset(h.decode() for h in _TRACE_HEADERS)
_MAX_MODEL_CHARS = 256


def operation_name(path: str) -> str | None:
    """GenAI `gen_ai.operation.name` of an OpenAI endpoint, None for the others."""
    return _OPERATIONS.get(path)


def _exporter(settings: TracingSettings, environ: Mapping[str, str]) -> SpanExporter:
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter(endpoint=settings.endpoint)
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as exc:
            raise SettingsError("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: grpc needs "
                                "opentelemetry-exporter-otlp-proto-grpc installed, got "
                                f"{protocol!r}") from exc
        return GrpcExporter(endpoint=settings.endpoint)
    raise SettingsError("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: expected http/protobuf | grpc, "
                        f"got {protocol!r}")


def _resource(settings: TracingSettings, environ: Mapping[str, str]) -> Resource:
    attrs: dict[str, str] = {}
    if settings.service_name is not None:
        attrs["service.name"] = settings.service_name
    elif not environ.get("OTEL_SERVICE_NAME") and \
            "service.name=" not in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").replace(" ", ""):
        attrs["service.name"] = DEFAULT_SERVICE_NAME
    return Resource.create(attrs)  # merges OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME


class Tracing:
    """One per app process, made in the lifespan startup (the batch processor starts a thread);
    `shutdown()` flushes what is queued."""

    def __init__(self, settings: TracingSettings, policy: str,
                 environ: Mapping[str, str] = os.environ,
                 exporter: SpanExporter | None = None) -> None:
        sampler = (None if settings.sample_ratio is None
                   else ParentBased(TraceIdRatioBased(settings.sample_ratio)))
        self.provider = TracerProvider(sampler=sampler, resource=_resource(settings, environ),
                                       shutdown_on_exit=False)
        self.provider.add_span_processor(
            BatchSpanProcessor(exporter or _exporter(settings, environ)))
        self.tracer = self.provider.get_tracer("prefix_router")
        self.policy = policy
        self.record_keys = settings.record_routing_keys

    def request(self, scope: MutableMapping[str, Any], record: AccessRecord) -> RequestTrace:
        return RequestTrace(self, scope, record)

    def shutdown(self) -> None:
        self.provider.shutdown()


def _parent(headers: Iterable[tuple[bytes, bytes]]) -> Any:
    carrier: dict[str, str] | None = None
    for name, value in headers:
        if name in _TRACE_HEADERS:
            if carrier is None:
                carrier = {}
            carrier[name.decode()] = value.decode("latin-1")
    return None if carrier is None else _PROPAGATOR.extract(carrier)


class RequestTrace:
    """The spans of one /v1 request. The app calls `routed` once a decision exists and `finish`
    last; the proxy calls `attempt` before and `attempt_end` after each upstream attempt, and
    `disconnected` when the client leaves."""

    __slots__ = ("_attempt", "_attempt_no", "_ctx", "_gone", "_phase", "_predicted", "_previous", "_reasons",
                 "_record_keys", "_relayed_status", "_stream", "_tracer", "_ttfb_ms", "_usage",
                 "span")

    def __init__(self, tracing: Tracing, scope: MutableMapping[str, Any],
                 record: AccessRecord) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        attrs: dict[str, Any] = {
            "http.request.method": method, "url.path": path,
            "url.scheme": scope.get("scheme", "http"), "http.route": path,
            "network.protocol.version": scope.get("http_version", "1.1"),
            "prefix_router.policy": tracing.policy}
        client = scope.get("client")
        if client:
            attrs["client.address"] = client[0]
        op = _OPERATIONS.get(path)
        if op is not None:
            attrs["gen_ai.operation.name"] = op
        self._tracer = tracing.tracer
        self._record_keys = tracing.record_keys
        self.span: Span = self._tracer.start_span(
            f"{method} {path}", context=_parent(scope["headers"]), kind=SpanKind.SERVER,
            attributes=attrs)
        self._ctx = otel_trace.set_span_in_context(self.span)
        sc = self.span.get_span_context()
        record.trace_id = format(sc.trace_id, "032x")
        record.span_id = format(sc.span_id, "016x")
        self._attempt: Span | None = None
        self._attempt_no = 0
        self._previous = ""
        self._reasons: list[str] = []
        self._relayed_status: int | None = None
        self._ttfb_ms: float | None = None
        self._stream = False
        self._gone = False
        self._phase: str | None = None  # router.disagg: the phase the next attempts belong to
        self._usage: Usage | None = None
        self._predicted: int | None = None

    # what the app learns -----------------------------------------------------------------------

    def routed(self, parsed: Mapping[str, Any] | None, key: Any, decision: Any) -> None:
        """The routing decision (`policy.Decision`) for the key (`keys.RoutingKey`)."""
        span = self.span
        if parsed is not None:
            model = parsed.get("model")
            if isinstance(model, str):
                span.set_attribute("gen_ai.request.model", model[:_MAX_MODEL_CHARS])
            self._stream = parsed.get("stream") is True
            span.set_attribute("prefix_router.stream", self._stream)
        span.set_attribute("prefix_router.branch", decision.branch.value)
        span.set_attribute("prefix_router.key_source", key.source.value)
        if decision.home is not None:
            span.set_attribute("prefix_router.home_replica", decision.home)
        if self._record_keys:
            if key.prefix is not None:
                span.set_attribute("prefix_router.key.prefix", key.prefix)
            if key.conversation is not None:
                span.set_attribute("prefix_router.key.conversation", key.conversation)

    def outcome(self, usage: Usage | None, predicted: int | None) -> None:
        """Token counts from the relayed response's `usage` (`router.usage.UsageTap`), and
        the cached tokens the prefix index predicted on the replica that served (None when
        the policy keeps no index)."""
        self._usage = usage
        self._predicted = predicted

    def disconnected(self) -> None:
        self._gone = True

    def phase(self, name: str, seconds: float | None = None) -> None:
        """A disaggregated request (`router.disagg`) enters phase ``name`` (prefill, decode):
        the attempts that follow carry ``prefix_router.phase``; entering decode, ``seconds`` is
        what the prefill phase took (``prefix_router.prefill_ms`` on the request span)."""
        if seconds is not None and self._phase == "prefill":
            self.span.set_attribute("prefix_router.prefill_ms", round(seconds * 1000, 3))
        self._phase = name

    # what the proxy reports --------------------------------------------------------------------

    def attempt(self, replica: str, url: Any, method: str,
                headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Start the next attempt's CLIENT span; returns the headers to send, carrying it as
        the traceparent (any incoming traceparent/tracestate dropped)."""
        self._attempt_no += 1
        n = self._attempt_no
        attrs: dict[str, Any] = {
            "http.request.method": method, "url.full": str(url.with_query(None)),
            "server.address": url.host or "", "prefix_router.replica": replica,
            "prefix_router.attempt": n}
        if url.port is not None:
            attrs["server.port"] = url.port
        if n > 1:
            attrs["http.request.resend_count"] = n - 1
        if self._phase is not None:
            attrs["prefix_router.phase"] = self._phase
        span = self._tracer.start_span(f"{method} {url.path}", context=self._ctx,
                                       kind=SpanKind.CLIENT, attributes=attrs)
        if n > 1 and self._reasons:
            span.add_event(RETRY_EVENT, {"prefix_router.retry.reason": self._reasons[-1],
                                         "prefix_router.retry.previous_replica":
                                             self._previous})
        self._attempt = span
        self._previous = replica
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=otel_trace.set_span_in_context(span))
        out = [h for h in headers if h[0] not in _TRACE_HEADER_NAMES]
        out.extend(carrier.items())
        return out

    def attempt_end(self, status: int | None, ttfb_ms: float | None, failure: str | None,
                    retried: bool) -> None:
        """End the current attempt: the replica's status (None without a response), the ms to
        its first body byte (None if it never relayed), the failure reason if any, and whether
        the request is retried on the next candidate."""
        span = self._attempt
        if span is None:
            return
        self._attempt = None
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if ttfb_ms is not None:
            span.set_attribute("prefix_router.ttft_ms", round(ttfb_ms, 3))
            self._ttfb_ms = ttfb_ms
            self._relayed_status = status
        if failure is not None:
            span.set_attribute("error.type", failure)
            span.set_status(Status(StatusCode.ERROR, failure))
        elif status is not None and status >= 400:
            span.set_attribute("error.type", str(status))
            span.set_status(Status(StatusCode.ERROR))
        if retried:
            self._reasons.append(failure or "retry")
        span.end()

    # the end -----------------------------------------------------------------------------------

    def finish(self, record: AccessRecord) -> None:
        span = self.span
        if self._attempt is not None:  # cancelled between attempt() and attempt_end()
            self.attempt_end(None, None, "cancelled", False)
        status = self._relayed_status
        if status is None and record.status != CLIENT_CLOSED and record.status:
            status = record.status  # answered by the router itself (4xx, 503...)
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        gone = self._gone or record.status == CLIENT_CLOSED
        span.set_attribute("prefix_router.client_disconnected", gone)
        if record.replica is not None:
            span.set_attribute("prefix_router.replica", record.replica)
        if self._attempt_no:
            span.set_attribute("prefix_router.attempts", self._attempt_no)
            span.set_attribute("prefix_router.retries", len(self._reasons))
            if self._reasons:
                span.set_attribute("prefix_router.retry_reasons", self._reasons)
        if self._ttfb_ms is not None:
            span.set_attribute("prefix_router.ttft_ms", round(self._ttfb_ms, 3))
            if self._stream:
                span.set_attribute("gen_ai.response.time_to_first_chunk", self._ttfb_ms / 1000)
        if self._predicted is not None:
            span.set_attribute("prefix_router.cached_tokens.predicted", self._predicted)
        if self._usage is not None:
            prompt, cached = self._usage
            if prompt is not None:
                span.set_attribute("gen_ai.usage.input_tokens", prompt)
            if cached is not None:
                span.set_attribute("gen_ai.usage.cache_read.input_tokens", cached)
                span.set_attribute("prefix_router.cached_tokens.reported", cached)
                if prompt:
                    span.set_attribute("prefix_router.cache_hit_ratio",
                                       round(cached / prompt, 4))
        if status is not None and status >= 500:
            span.set_attribute("error.type", str(status))
            span.set_status(Status(StatusCode.ERROR))
        span.end()
