"""A data plane that talks to an endpoint picker the way an Envoy gateway does (ext_proc).

What Envoy's ext_proc filter sends, built from Envoy's own protos (xds-protos), for one HTTP
request (`ExtProcStream`): the request headers (pseudo-headers first, values in ``raw_value``,
``protocol_config`` with the body modes on the first message, the subset hint in
``metadata_context`` when the gateway sets one), then the body - FULL_DUPLEX_STREAMED: chunk by
chunk, the last with ``end_of_stream``; BUFFERED: after the headers answer, in one message -
and, with the response phase on, the response headers (``:status``, the served endpoint in
``metadata_context["envoy.lb"]``) and the response body chunks.

`Gateway.request` does what the gateway does around that: asks the EPP, sends the (echoed)
request body to the first endpoint it named (the next ones on a connect failure: the retry
order), and feeds the response back through the response phase. `EppThread` runs a
`router.epp.server.EppServer` on its own event loop in a thread. Every stream has a deadline,
so nothing here can hang a test or a benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue, Metadata
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpBody,
    HttpHeaders,
    ProcessingRequest,
    ProcessingResponse,
    ProtocolConfiguration,
)
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from google.protobuf.struct_pb2 import Struct

from router.epp.server import EppServer
from router.epp.wire import DESTINATION, SERVED, SUBSET, SUBSET_NAMESPACE
from router.settings import Settings

__all__ = ["BUFFERED", "FULL_DUPLEX", "EppThread", "ExtProcStream", "Gateway", "Picked", "ask",
           "body_message", "endpoints_of", "headers_message", "response_headers_message"]

FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = ProcessingMode.BUFFERED
DEADLINE = 30.0  # seconds: no stream outlives it


def _header_map(pairs: Sequence[tuple[str, str]]) -> HeaderMap:
    return HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode("latin-1"))
                              for k, v in pairs])


def headers_message(path: str, body: bytes | None, *, method: str = "POST",
                    mode: int | None = FULL_DUPLEX, response_mode: int = FULL_DUPLEX,
                    subset: Sequence[str] | None = None,
                    extra: Sequence[tuple[str, str]] = ()) -> ProcessingRequest:
    """The request headers as Envoy sends them (``mode`` None: no ``protocol_config``, as
    Envoy before 1.35)."""
    pairs = [(":authority", "gateway.local"), (":path", path), (":method", method),
             (":scheme", "http"), ("x-request-id", "0b5d7c1e-epp")]
    if body is not None:
        pairs += [("content-type", "application/json"), ("content-length", str(len(body)))]
    pairs += list(extra)
    msg = ProcessingRequest(request_headers=HttpHeaders(headers=_header_map(pairs),
                                                        end_of_stream=body is None))
    if mode is not None:
        msg.protocol_config.CopyFrom(ProtocolConfiguration(request_body_mode=mode,  # type: ignore[arg-type]
                                                           response_body_mode=response_mode))  # type: ignore[arg-type]
    if subset is not None:
        hint = Struct()
        hint.update({SUBSET: list(subset)})
        msg.metadata_context.CopyFrom(Metadata(filter_metadata={SUBSET_NAMESPACE: hint}))
    return msg


def body_message(chunk: bytes, end_of_stream: bool, response: bool = False) -> ProcessingRequest:
    body = HttpBody(body=chunk, end_of_stream=end_of_stream)
    if response:
        return ProcessingRequest(response_body=body)
    return ProcessingRequest(request_body=body)


def response_headers_message(status: int, served: str | None, content_type: str,
                             end_of_stream: bool = False,
                             namespace: str = "envoy.lb") -> ProcessingRequest:
    msg = ProcessingRequest(response_headers=HttpHeaders(
        headers=_header_map([(":status", str(status)), ("content-type", content_type)]),
        end_of_stream=end_of_stream))
    if served is not None:
        meta = Struct()
        meta.update({SERVED: served})
        msg.metadata_context.CopyFrom(Metadata(filter_metadata={namespace: meta}))
    return msg


class ExtProcStream:
    """One ``Process`` stream, message by message: `send`, `recv`, `close` (half-close)."""

    def __init__(self, stub: ExternalProcessorStub, deadline: float = DEADLINE) -> None:
        self._q: queue.Queue[ProcessingRequest | None] = queue.Queue()
        self._calls = stub.Process(self._requests(), timeout=deadline)

    def _requests(self) -> Iterator[ProcessingRequest]:
        while True:
            msg = self._q.get()
            if msg is None:
                return
            yield msg

    def send(self, msg: ProcessingRequest) -> None:
        self._q.put(msg)

    def recv(self) -> ProcessingResponse | None:
        """The next answer; None once the EPP ended the stream."""
        try:
            return next(self._calls)  # type: ignore[no-any-return]
        except StopIteration:
            return None

    def close(self) -> None:
        self._q.put(None)

    def cancel(self) -> None:
        self._q.put(None)
        self._calls.cancel()

    def code(self) -> grpc.StatusCode:
        return self._calls.code()  # type: ignore[no-any-return]


def endpoints_of(answer: ProcessingResponse) -> tuple[list[str], list[str]]:
    """The endpoints named in the header mutation and in the dynamic metadata of an answer."""
    kind = answer.WhichOneof("response")
    common = getattr(answer, kind).response if kind in ("request_headers",
                                                        "request_body") else None
    header: list[str] = []
    if common is not None:
        for h in common.header_mutation.set_headers:
            if h.header.key == DESTINATION:
                header = (h.header.raw_value.decode() or h.header.value).split(",")
    meta: list[str] = []
    fields = answer.dynamic_metadata.fields
    if "envoy.lb" in fields:
        inner = fields["envoy.lb"].struct_value.fields
        if DESTINATION in inner:
            meta = inner[DESTINATION].string_value.split(",")
    return header, meta


@dataclass
class Picked:
    """What the EPP answered for one request's request phase."""

    endpoints: list[str] = field(default_factory=list)  # from the header mutation
    metadata: list[str] = field(default_factory=list)  # from the dynamic metadata
    body: bytes = b""  # the body the EPP sent back (FULL_DUPLEX_STREAMED)
    status: int | None = None  # an immediate response's status
    error: dict[str, Any] | None = None  # its JSON body
    answers: list[ProcessingResponse] = field(default_factory=list)
    seconds: float = 0.0  # from the first message sent to the answer naming the endpoints


def ask(stream: ExtProcStream, path: str, body: bytes | None, *, mode: int = FULL_DUPLEX,
        chunks: int = 3, subset: Sequence[str] | None = None,
        extra: Sequence[tuple[str, str]] = (), response_mode: int = FULL_DUPLEX,
        send_mode: bool = True) -> Picked:
    """The request phase of one request, as Envoy drives it in ``mode``."""
    picked = Picked()
    t0 = time.perf_counter()
    stream.send(headers_message(path, body, mode=mode if send_mode else None,
                                response_mode=response_mode, subset=subset, extra=extra))

    def take() -> ProcessingResponse | None:
        answer = stream.recv()
        picked.seconds = time.perf_counter() - t0
        if answer is not None:
            picked.answers.append(answer)
            if answer.HasField("immediate_response"):
                picked.status = int(answer.immediate_response.status.code)
                picked.error = json.loads(answer.immediate_response.body or b"null")
                return None
        return answer

    if body is None:
        answer = take()
        if answer is not None:
            picked.endpoints, picked.metadata = endpoints_of(answer)
        return picked
    if mode == BUFFERED:
        if take() is None:  # the headers' answer (continue), or an immediate response
            return picked
        stream.send(body_message(body, True))
        answer = take()
        if answer is not None:
            picked.endpoints, picked.metadata = endpoints_of(answer)
            picked.body = body  # BUFFERED: the gateway keeps its own copy
        return picked
    size = max(1, -(-len(body) // max(1, chunks)))
    parts = [body[i:i + size] for i in range(0, len(body), size)] or [b""]
    for i, part in enumerate(parts):
        stream.send(body_message(part, i == len(parts) - 1))
    answer = take()  # the headers' answer, sent once the body is complete
    if answer is None:
        return picked
    picked.endpoints, picked.metadata = endpoints_of(answer)
    seconds = picked.seconds
    while True:
        echoed = take()
        if echoed is None:
            break
        streamed = echoed.request_body.response.body_mutation.streamed_response
        picked.body += streamed.body
        if streamed.end_of_stream:
            break
    picked.seconds = seconds
    return picked


class Gateway:
    """Ask the EPP, send the request to the endpoint it named, feed the response back."""

    def __init__(self, epp_port: int, *, mode: int = FULL_DUPLEX, response_phase: bool = True,
                 response_body: bool = True, timeout: float = 60.0) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{epp_port}")
        self.stub = ExternalProcessorStub(self.channel)
        self.mode = mode
        self.response_phase = response_phase
        self.response_body = response_body  # False: response headers only (body mode NONE)
        self.http = httpx.Client(timeout=timeout)

    def close(self) -> None:
        self.http.close()
        self.channel.close()

    def request(self, path: str, body: bytes, *, subset: Sequence[str] | None = None,
                extra: Sequence[tuple[str, str]] = ()) -> tuple[Picked, httpx.Response | None,
                                                                str | None]:
        """One request through the gateway: (the EPP's answer, the replica's response, the
        endpoint that served)."""
        stream = ExtProcStream(self.stub)
        try:
            picked = ask(stream, path, body, mode=self.mode, subset=subset, extra=extra)
            if picked.status is not None or not picked.endpoints:
                return picked, None, None
            headers = {"content-type": "application/json", **dict(extra)}
            resp: httpx.Response | None = None
            served = None
            for endpoint in picked.endpoints:  # the retry order, on a connect failure
                try:
                    resp = self.http.post(f"http://{endpoint}{path}", content=picked.body,
                                          headers=headers)
                    served = endpoint
                    break
                except httpx.ConnectError:
                    continue
            if resp is not None and self.response_phase:
                self._respond(stream, resp, served)
            return picked, resp, served
        finally:
            stream.close()
            with contextlib.suppress(grpc.RpcError):
                while stream.recv() is not None:
                    pass

    def _respond(self, stream: ExtProcStream, resp: httpx.Response, served: str | None) -> None:
        ctype = resp.headers.get("content-type", "application/json")
        content = resp.content
        stream.send(response_headers_message(resp.status_code, served, ctype,
                                             end_of_stream=not content))
        stream.recv()
        if not content or not self.response_body:
            return
        size = 1024
        parts = [content[i:i + size] for i in range(0, len(content), size)]
        for i, part in enumerate(parts):
            stream.send(body_message(part, i == len(parts) - 1, response=True))
            stream.recv()


class EppThread:
    """A `router.epp.server.EppServer` on its own event loop in a daemon thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.server = EppServer(settings)
        self.port = 0
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> EppThread:
        self._thread.start()
        self.port = self._call(self.server.start())
        return self

    def stop(self) -> None:
        try:
            self._call(self.server.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()

    def run(self, fn: Any) -> Any:
        """Call ``fn()`` on the server's loop (to read its state without racing it)."""
        async def call() -> Any:
            return fn()
        return self._call(call())

    def __enter__(self) -> EppThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
