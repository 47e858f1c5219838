"""A real OTLP/HTTP trace receiver for tests: a loopback HTTP server that decodes each
`ExportTraceServiceRequest` (protobuf, optionally gzip) with opentelemetry-proto and keeps the
spans as plain values, so a test can assert on what any exporter - the router's SDK, vLLM's -
really sent.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from loadtest._net import quiet_port

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    kind: str  # SERVER, CLIENT, INTERNAL...
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    attributes: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...]
    status: str  # UNSET, OK, ERROR
    resource: dict[str, Any] = field(default_factory=dict)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return None if kind is None else getattr(v, kind)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def decode(body: bytes) -> list[ReceivedSpan]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

    req = ExportTraceServiceRequest.FromString(body)
    out = []
    for rs in req.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(ReceivedSpan(
                    name=s.name, kind=Span.SpanKind.Name(s.kind).removeprefix("SPAN_KIND_"),
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex(), attributes=_attrs(s.attributes),
                    events=tuple((e.name, _attrs(e.attributes)) for e in s.events),
                    status=Status.StatusCode.Name(s.status.code).removeprefix("STATUS_CODE_"),
                    resource=resource))
    return out


class OtlpReceiver:
    """`with OtlpReceiver() as rx:` point an exporter at `rx.endpoint`, then `rx.wait_for(...)`."""

    def __init__(self) -> None:
        self.port = quiet_port()
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != TRACES_PATH:
                    self.send_error(404)
                    return
                spans = decode(body)
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceResponse,
                )
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}{TRACES_PATH}"

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(self, check: Callable[[list[ReceivedSpan]], bool], what: str,
                 timeout: float = 15.0) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        while True:
            spans = self.snapshot()
            if check(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; got "
                                     f"{[(s.name, s.kind) for s in spans]}")
            time.sleep(0.05)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
