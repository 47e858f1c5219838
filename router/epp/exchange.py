"""One ext_proc stream (one HTTP request through the gateway): messages in, answers out.

`Exchange.handle(message)` takes each `ProcessingRequest` in arrival order and returns the
`ProcessingResponse`s to send, in order. The decision is ``serve``'s own:
`router.app.RouterApp.decide` (model pool, then `router.routing.Router.route`), on the body
parsed once by `router.body.validate_body`; a held request (`Routed.leader`) waits for its
leader as in ``serve`` before the endpoints are named.

Request phase, by the gateway's request body mode (``protocol_config`` of the first message,
else ``epp.body_mode``):

- FULL_DUPLEX_STREAMED: the request headers get no answer yet; body chunks are collected until
  ``end_of_stream`` (or the request trailers); then the answers are the headers response naming
  the endpoints, the body back unchanged as ``streamed_response`` chunks - the chunks as they
  came, the last with ``end_of_stream`` as received - and the trailers response if trailers
  came;
- BUFFERED / BUFFERED_PARTIAL: the headers are answered at once (continue); the buffered body's
  answer names the endpoints (a header mutation on the held request headers) and leaves the
  body alone;
- a request without a body (headers with ``end_of_stream``), or mode NONE / STREAMED (the body
  comes after the upstream is chosen): decided on the headers alone, as ``serve`` routes a
  request it does not parse.

Errors, each an ``ImmediateResponse`` in OpenAI error format after which the stream is over
(`done`): a Content-Length or collected body over ``proxy.max_body_bytes`` 413; invalid JSON or
shape 400; a model no replica serves 404 ``model_not_found``; no available replica (in the pool,
or in the gateway's subset) 503. A message out of protocol order (a second request headers, a
body before headers, a response before the pick, anything after ``done``, an empty message)
raises `ProtocolViolation`: the service ends the stream with INVALID_ARGUMENT.

Response phase (only when the gateway is configured to send it): the response headers give
the served endpoint and the status (`router.epp.outcome.Outcome.served`); body chunks feed the
request's `UsageTap` and are echoed as ``streamed_response`` in FULL_DUPLEX_STREAMED, else
continued; the response's end (headers or body with ``end_of_stream``, or trailers) ends the
attempt. `close()` - called by the service however the stream ends - ends it too.

Cost per request: one JSON parse and the routing decision; O(body) to collect the chunks (one
join); O(1) per response message plus O(chunk) for the usage tail.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse

from router.accesslog import AccessRecord
from router.app import RouterApp
from router.body import PROMPT_FIELDS, validate_body
from router.epp.outcome import Outcome
from router.epp.wire import (
    continue_body,
    continue_headers,
    continue_trailers,
    header_pairs,
    immediate,
    pick_in_body,
    pick_in_headers,
    served_endpoint,
    streamed_body,
    subset_hint,
)
from router.errors import InvalidRequest, NoReplicaAvailable, PayloadTooLarge, RouterError
from router.models import Pool
from router.proxy import attempt_plan
from router.replicas import ReplicaState, address_of
from router.settings import EppSettings

__all__ = ["Exchange", "ProtocolViolation"]

_FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED
_BUFFERED = (ProcessingMode.BUFFERED, ProcessingMode.BUFFERED_PARTIAL)
_MODES = {"full_duplex_streamed": _FULL_DUPLEX, "buffered": ProcessingMode.BUFFERED}


class ProtocolViolation(Exception):
    """A message the ext_proc protocol does not allow at this point of the stream."""


class Exchange:
    __slots__ = ("_body", "_core", "_headers", "_mode", "_namespace", "_path", "_response_mode",
                 "_settings", "_size", "_stage", "_subset", "_trailers", "done", "outcome",
                 "record")

    def __init__(self, core: RouterApp, settings: EppSettings) -> None:
        self._core = core
        self._settings = settings
        self._namespace = settings.metadata_namespace
        self._mode: int | None = None  # the request body mode, from the first message
        self._response_mode = _FULL_DUPLEX
        self._stage = "headers"  # headers -> body -> picked -> answered
        self._headers: list[tuple[bytes, bytes]] = []
        self._path = ""
        self._body: list[bytes] = []
        self._size = 0
        self._subset: frozenset[str] | None = None
        self._trailers = False
        self.done = False  # an immediate response was sent, or the response ended
        self.outcome: Outcome | None = None
        self.record = AccessRecord("POST", "")

    async def handle(self, msg: ProcessingRequest) -> list[ProcessingResponse]:
        if self.done:
            raise ProtocolViolation("message after the exchange ended")
        kind = msg.WhichOneof("request")
        if self._mode is None:
            self._mode = self._first(msg)
        try:
            if kind == "request_headers":
                return await self._request_headers(msg)
            if kind == "request_body":
                return await self._request_body(msg)
            if kind == "request_trailers":
                return await self._request_trailers(msg)
            if kind == "response_headers":
                return self._response_headers(msg)
            if kind == "response_body":
                return self._response_body(msg)
            if kind == "response_trailers":
                return self._response_trailers()
        except RouterError as err:
            self.done = True
            self.record.status = err.status
            self._core.reject(err)
            return [immediate(err)]
        raise ProtocolViolation(f"unexpected message {kind!r}")

    def close(self) -> None:
        """The stream is over (ended, failed or cancelled): release the open attempt."""
        self.done = True
        if self.outcome is not None:
            self.outcome.end()

    # request phase -------------------------------------------------------------------------

    def _first(self, msg: ProcessingRequest) -> int:
        if msg.HasField("protocol_config"):
            pc = msg.protocol_config
            self._response_mode = pc.response_body_mode
            return pc.request_body_mode
        mode = self._response_mode = _MODES[self._settings.body_mode]
        return mode

    def _expect(self, stage: str, what: str) -> None:
        if self._stage != stage:
            raise ProtocolViolation(f"{what} while {self._stage}")

    async def _request_headers(self, msg: ProcessingRequest) -> list[ProcessingResponse]:
        self._expect("headers", "request headers")
        self._headers = headers = header_pairs(msg.request_headers)
        self._subset = subset_hint(msg)
        method = path = ""
        for name, value in headers:
            if name == b":path":
                path = value.decode("latin-1").split("?", 1)[0]
            elif name == b":method":
                method = value.decode("latin-1")
            elif name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    raise InvalidRequest("invalid Content-Length",
                                         code="invalid_content_length") from None
                limit = self._core.settings.proxy.max_body_bytes
                if declared > limit:
                    raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit "
                                          f"of {limit} bytes")
        self._path = path
        self.record.method, self.record.path = method or "POST", path
        if msg.request_headers.end_of_stream:  # no body: an empty one, validated as serve does
            self._stage = "picked"
            return [pick_in_headers(await self._decide(b""), self._namespace)]
        if self._mode not in (_FULL_DUPLEX, *_BUFFERED):  # the body is not ours to see
            self._stage = "picked"
            return [pick_in_headers(await self._decide(None), self._namespace)]
        self._stage = "body"
        if self._mode == _FULL_DUPLEX:
            return []  # answered once the body is complete
        return [continue_headers(False)]

    async def _request_body(self, msg: ProcessingRequest) -> list[ProcessingResponse]:
        if self._stage == "picked" and self._mode not in (_FULL_DUPLEX, *_BUFFERED):
            return [continue_body(False)]  # decided on the headers: body passes through
        self._expect("body", "request body")
        chunk = msg.request_body.body
        self._size += len(chunk)
        limit = self._core.settings.proxy.max_body_bytes
        if self._size > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        self._body.append(chunk)
        eos = msg.request_body.end_of_stream
        if self._mode == _FULL_DUPLEX and not eos:
            return []
        return await self._body_complete(eos)

    async def _request_trailers(self, msg: ProcessingRequest) -> list[ProcessingResponse]:
        if self._stage == "picked":
            return [continue_trailers(False)]
        self._expect("body", "request trailers")
        self._trailers = True
        return await self._body_complete(False)

    async def _body_complete(self, eos: bool) -> list[ProcessingResponse]:
        chunks, self._body = self._body, []
        endpoints = await self._decide(b"".join(chunks))
        self._stage = "picked"
        if self._mode != _FULL_DUPLEX:
            return [pick_in_body(endpoints, self._namespace)]
        # the body back as it came, chunk by chunk: no message larger than the gateway's own
        last = len(chunks) - 1
        out = [pick_in_headers(endpoints, self._namespace)]
        out += [streamed_body(False, c, eos and i == last) for i, c in enumerate(chunks)]
        if self._trailers:
            out.append(continue_trailers(False))
        return out

    async def _decide(self, body: bytes | None) -> str:
        """Validate, route, start the attempt; the endpoints to name (the pick first).
        ``body`` None: the gateway does not send it; routed unparsed."""
        t0 = time.perf_counter()
        try:
            endpoints = await self._pick(body)
        except RouterError:
            self._core.metrics.epp_decided("rejected", time.perf_counter() - t0)
            raise
        self._core.metrics.epp_decided("picked", time.perf_counter() - t0)
        return endpoints

    async def _pick(self, body: bytes | None) -> str:
        core = self._core
        parsed: dict[str, Any] | None = None
        if body is not None:
            self.record.bytes_in = len(body)
            if self.record.method == "POST" and self._path in PROMPT_FIELDS:
                parsed = validate_body(self._path, self._headers, body)
        kc = core.key_config
        wanted = {kc.key_header.lower(): kc.key_header, kc.session_header.lower():
                  kc.session_header}
        key_headers = {wanted[n]: v.decode("latin-1") for n, v in
                       ((n.decode("latin-1"), v) for n, v in self._headers) if n in wanted}
        routed = core.decide(self._path, key_headers, parsed, self.record, self._narrow())
        plan = attempt_plan(routed.decision.candidates, core.replicas,
                            core.settings.proxy.max_attempts)
        if not plan:  # the pick left the membership between decision and now
            raise NoReplicaAvailable("no healthy replica", retry_after=1)
        if routed.leader is not None:
            await core.hold(routed.leader, routed.decision.replica)
        self.outcome = Outcome(core, routed, self.record)
        self.outcome.start(plan[0])
        return ",".join(address_of(r.url) for r in plan)

    def _narrow(self) -> Callable[[Pool], Pool] | None:
        subset = self._subset
        if subset is None:
            return None

        def narrow(pool: Pool) -> Pool:
            members = tuple(r for r in pool.members if address_of(r.url) in subset)
            return Pool(pool.status, members, pool.label, pool.adapter)

        return narrow

    # response phase ------------------------------------------------------------------------

    def _served_replica(self, msg: ProcessingRequest) -> ReplicaState | None:
        outcome = self.outcome
        assert outcome is not None
        served = served_endpoint(msg, self._namespace)
        if served is not None:
            for r in self._core.replicas.states():
                if address_of(r.url) == served:
                    return r
        return outcome.replica

    def _response_headers(self, msg: ProcessingRequest) -> list[ProcessingResponse]:
        self._expect("picked", "response headers")
        self._stage = "answered"
        status = 0
        for name, value in header_pairs(msg.response_headers):
            if name == b":status":
                try:
                    status = int(value)
                except ValueError:
                    status = 0
        outcome = self.outcome
        assert outcome is not None
        replica = self._served_replica(msg)
        if replica is not None and 100 <= status <= 599:
            outcome.served(replica, status)
        if msg.response_headers.end_of_stream:
            self._finish()
        return [continue_headers(True)]

    def _response_body(self, msg: ProcessingRequest) -> list[ProcessingResponse]:
        if self._stage == "picked":  # the gateway skips the response headers: status unknown
            self._stage = "answered"
        self._expect("answered", "response body")
        body = msg.response_body
        outcome = self.outcome
        assert outcome is not None
        tap = outcome.routed.tap
        if tap is not None:
            tap.feed(body.body)
        if body.end_of_stream:
            self._finish()
        if self._response_mode == _FULL_DUPLEX:
            return [streamed_body(True, body.body, body.end_of_stream)]
        return [continue_body(True)]

    def _response_trailers(self) -> list[ProcessingResponse]:
        if self._stage == "picked":
            self._stage = "answered"
        self._expect("answered", "response trailers")
        self._finish()
        return [continue_trailers(True)]

    def _finish(self) -> None:
        self.done = True
        if self.outcome is not None:
            self.outcome.end()
