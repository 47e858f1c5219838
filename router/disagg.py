"""Prefill/decode disaggregation: one client request served in two phases, as vLLM's proxy does.

For a request to a disaggregated pool (`router.disagg_routing.split`), after the app routed it
with `router.routing.Router.route` over the pool's prefill instances:

1. **Prefill.** The client's body with ``kv_transfer_params = {do_remote_decode: true,
   do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null,
   remote_port: null}``, ``stream: false``, ``max_tokens: 1`` (and ``max_completion_tokens: 1``
   when set), without ``stream_options``, ``min_tokens``, ``min_completion_tokens`` - the request
   vLLM's toy proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py) sends - goes to
   the decision's replica through `router.proxy.Forwarder` with the request's `Routed` as the
   outcome hooks, so the prefix index learns the prefill instance that answered. Its answer is
   read back (`Capture`, at most ``disagg.max_prefill_response`` bytes), never relayed. A
   failure - connect, timeout, 5xx - moves on to the decision's next available candidate (a
   prefill instance: the pool is the prefill pool), at most ``proxy.max_attempts`` attempts;
   a 4xx (the request itself is bad) or the last candidate's error is relayed to the client as
   the replica answered it. The whole phase is bounded by ``disagg.prefill_timeout`` (504).
2. **Decode.** The decode instance is `disagg_routing.pick_decode`'s (by load; none available:
   503 ``no_replica_available``). It gets the client's body with the ``kv_transfer_params`` the
   prefill answered (a prefill without any sends none, outcome ``no_kv_transfer``: a connector
   that needs none, e.g. vLLM's shared-storage ExampleConnector, or no connector - then the
   decode instance prefills itself), streamed or not as the client asked,
   relayed unbuffered by the same Forwarder. Once sent, nothing is retried: the decode instance
   may already have read, and so released, the prefill's KV.

Both phases carry the same ``x-request-id`` (the client's, else a new one), as vLLM's proxy
sends; phase 1 also drops ``accept-encoding`` (its answer is parsed here).

Client disconnect: the Forwarder cancels the phase running (closing its upstream connection, so
that vLLM aborts the request) and a disconnect before phase 2 means it never starts. Errors are
`router.errors` types, answered by the app in OpenAI format (`RouterApp._answer_error`).

Observability: ``prefix_router_disagg_requests_total{outcome}``,
``prefix_router_disagg_phase_seconds{phase=prefill|transfer_first_token, replica}``,
``prefix_router_disagg_time_to_first_byte_seconds``; the per-attempt metrics as for any request
(the decode attempts under branch ``decode_load``); the access log's ``prefill_replica`` /
``prefill_branch``; trace attempts tagged ``prefix_router.phase`` and the request span's
``prefix_router.prefill_ms``.

Cost: one JSON encode per phase (the bodies differ from the client's) and one decode of the
prefill's answer; no extra copy of the decode stream.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from prefix_asgi import Message, Receive, Scope, Send
from router.accesslog import CLIENT_CLOSED, AccessRecord
from router.disagg_routing import Phases, pick_decode
from router.errors import NoReplicaAvailable, RouterError, UpstreamError, UpstreamTimeout
from router.metrics import RouterMetrics
from router.policy import Branch
from router.proxy import AttemptTrace, Forwarder
from router.routing import Routed, Router
from router.settings import Settings

__all__ = ["Capture", "GENERATE_PATHS", "PREFILL_PARAMS", "PhaseTrace", "TwoPhase", "decode_body", "prefill_body"]

# what a prefill instance is asked for (vLLM's toy proxy sends exactly these)
PREFILL_PARAMS: Mapping[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None}
_REQUEST_ID = b"x-request-id"
# the endpoints served in two phases; any other (embeddings, models...) goes to one replica
GENERATE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


class PhaseTrace(AttemptTrace, Protocol):
    """`router.tracing.RequestTrace` as this module uses it."""

    def phase(self, name: str, seconds: float | None = None) -> None: ...


def prefill_body(parsed: Mapping[str, Any]) -> bytes:
    """The prefill phase's request body (module docstring, step 1)."""
    body = dict(parsed)
    body["kv_transfer_params"] = dict(PREFILL_PARAMS)
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    for name in ("stream_options", "min_tokens", "min_completion_tokens"):
        body.pop(name, None)
    return json.dumps(body).encode()


def decode_body(parsed: Mapping[str, Any], params: Mapping[str, Any] | None) -> bytes:
    """The decode phase's request body: the client's, with the prefill's transfer params."""
    body = dict(parsed)
    if params is None:
        body.pop("kv_transfer_params", None)
    else:
        body["kv_transfer_params"] = params
    return json.dumps(body).encode()


class Capture:
    """An ASGI ``send`` that keeps one response instead of sending it (at most ``limit`` body
    bytes; ``overflow`` says more came)."""

    __slots__ = ("body", "headers", "limit", "overflow", "status")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.overflow = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = list(message.get("headers") or ())
        elif message["type"] == "http.response.body":
            chunk = message.get("body") or b""
            if len(self.body) + len(chunk) > self.limit:
                self.overflow = True
            else:
                self.body += chunk

    async def relay(self, send: Send) -> None:
        """Send the kept response on (an error the client is to see as the replica gave it)."""
        await send({"type": "http.response.start", "status": self.status or 502,
                    "headers": self.headers})
        await send({"type": "http.response.body", "body": bytes(self.body)})

    def transfer_params(self, replica: str) -> dict[str, Any] | None:
        """The answer's ``kv_transfer_params`` (None when it has none); UpstreamError when the
        answer is not the JSON object of a completion."""
        try:
            answer = json.loads(self.body) if not self.overflow else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise UpstreamError(f"prefill replica {replica} answered without a completion "
                                "object")
        params = answer.get("kv_transfer_params")
        return params if isinstance(params, dict) else None


def _headers(scope_headers: Iterable[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]],
                                                                    list[tuple[bytes, bytes]]]:
    """(prefill headers, decode headers): the client's plus one ``x-request-id`` for both;
    the prefill's without ``accept-encoding``."""
    headers = list(scope_headers)
    if not any(n == _REQUEST_ID for n, _ in headers):
        headers.append((_REQUEST_ID, uuid.uuid4().hex.encode()))
    return [h for h in headers if h[0] != b"accept-encoding"], headers


class TwoPhase:
    """The two-phase proxy of one app (module docstring)."""

    def __init__(self, settings: Settings, router: Router, forwarder: Forwarder,
                 metrics: RouterMetrics) -> None:
        self.settings = settings
        self.router = router
        self.forwarder = forwarder
        self.metrics = metrics

    def check_decode(self, phases: Phases) -> None:
        """503 before anything is sent when no decode instance is available."""
        if not any(r.available for r in phases.decode):
            self.metrics.disagg("no_decode")
            raise NoReplicaAvailable("no decode instance available", retry_after=1)

    async def serve(self, scope: Scope, receive: Receive, send: Send, parsed: Mapping[str, Any],
                    phases: Phases, routed: Routed, record: AccessRecord,
                    trace: PhaseTrace | None) -> None:
        """Serve ``parsed`` in two phases; RouterError before anything reached the client."""
        t0 = time.perf_counter()
        first, second = _headers(scope["headers"])
        if trace is not None:
            trace.phase("prefill")
        try:
            async with asyncio.timeout(self.settings.disagg.prefill_timeout):
                answer = await self._prefill(scope, receive, prefill_body(parsed), first,
                                             routed, record, trace)
        except TimeoutError:
            self.metrics.disagg("timeout")
            raise UpstreamTimeout(f"prefill phase over disagg.prefill_timeout "
                                  f"({self.settings.disagg.prefill_timeout:g}s)") from None
        except RouterError:
            self.metrics.disagg("prefill_failed")
            raise
        if answer is None:
            self.metrics.disagg("client_closed")
            return
        prefill_replica = record.replica or ""
        if answer.status != 200:
            self.metrics.disagg("prefill_failed")
            await answer.relay(send)
            record.status = answer.status or 502
            return
        try:
            params = answer.transfer_params(prefill_replica)
        except UpstreamError:
            self.metrics.disagg("prefill_failed")
            raise
        prefill_s = time.perf_counter() - t0
        self.metrics.disagg_phase_time("prefill", prefill_replica, prefill_s)
        s = self.settings.routing
        decision = pick_decode(phases.decode, routed.prompt_tokens, s.decode_tokens,
                               self.router.mean_prefill, s.kv_high, self._rank(routed, phases))
        if decision is None:
            self.metrics.disagg("no_decode")
            raise NoReplicaAvailable("no decode instance available", retry_after=1)
        record.prefill_replica, record.prefill_branch = prefill_replica, record.branch
        record.branch = Branch.DECODE_LOAD.value
        record.ttfb_ms = None
        if trace is not None:
            trace.phase("decode", prefill_s)
        try:
            await self.forwarder.forward(scope, receive, send, decode_body(parsed, params),
                                         decision.candidates, record, None, trace, second)
        except RouterError:
            self.metrics.disagg("decode_failed")
            raise
        self._decoded(record, prefill_s, params is not None)

    def _rank(self, routed: Routed, phases: Phases) -> dict[str, int] | None:
        """The decode members in the request key's ring order (None without a key)."""
        key = routed.key.ring_key
        if key is None:
            return None
        names = {r.name for r in phases.decode}
        walk = (n for n in self.router.replicas.ring.walk(key) if n in names)
        return {n: i for i, n in enumerate(walk)}

    def _decoded(self, record: AccessRecord, prefill_s: float, transferred: bool) -> None:
        if record.status == CLIENT_CLOSED:
            self.metrics.disagg("client_closed")
        elif record.status >= 400:
            self.metrics.disagg("decode_failed")
        else:
            self.metrics.disagg("ok" if transferred else "no_kv_transfer")
        if record.ttfb_ms is not None:  # the decode instance's first byte came
            decode_s = record.ttfb_ms / 1000
            self.metrics.disagg_phase_time("transfer_first_token", record.replica or "",
                                           decode_s)
            self.metrics.disagg_first_byte(prefill_s + decode_s)
            record.ttfb_ms += prefill_s * 1000  # the client's time to first byte

    async def _prefill(self, scope: Scope, receive: Receive, body: bytes,
                       headers: list[tuple[bytes, bytes]], routed: Routed, record: AccessRecord,
                       trace: PhaseTrace | None) -> Capture | None:
        """The prefill attempts; the answer kept (None: the client left)."""
        replicas = self.router.replicas
        candidates = routed.decision.candidates
        plan = [n for i, n in enumerate(candidates)
                if (r := replicas.get(n)) is not None and (i == 0 or r.available)]
        plan = plan[:self.settings.proxy.max_attempts]
        limit = self.settings.disagg.max_prefill_response
        for tried, name in enumerate(plan, 1):
            last = tried == len(plan)
            answer = Capture(limit)
            record.status = 0
            try:
                await self.forwarder.forward(scope, receive, answer, body, (name,), record,
                                             routed, trace, headers)
            except UpstreamError as exc:
                if last:
                    raise
                self.metrics.retry(name, exc.reason)
                continue
            except NoReplicaAvailable as exc:  # the one candidate was unreachable
                if last:
                    raise
                self.metrics.retry(name, "connect" if exc.__cause__ is not None else "error")
                continue
            if record.status == CLIENT_CLOSED:
                return None
            if answer.status is not None and answer.status >= 500 and not last:
                self.metrics.retry(name, f"status_{answer.status}")
                continue
            if answer.overflow:
                raise UpstreamError(f"prefill replica {name} answered more than "
                                    f"disagg.max_prefill_response ({limit} bytes)")
            return answer
        raise NoReplicaAvailable("no prefill instance available", retry_after=1)

