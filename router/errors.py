"""Every error the router can answer with, and the one place transport exceptions are translated.

Tree:

    RouterError                      -> an HTTP answer in OpenAI error format
      InvalidRequest        400      invalid JSON / shape / content type
      Unauthorized          401      missing or wrong bearer key
      NotFound              404      path outside /v1/* and the router's own routes
        ModelNotFound       404      a model no replica serves (code model_not_found)
      RequestTimeout        408      head or body not received within its limits.* deadline
      PayloadTooLarge       413      body over proxy.max_body_bytes
      UriTooLong            414      request line over limits.max_request_line
      TooManyRequests       429      proxy.max_in_flight reached (Retry-After)
      HeaderFieldsTooLarge  431      over limits.max_header_count or limits.max_header_bytes
      NoReplicaAvailable    503      nothing healthy to send to (Retry-After)
      TooManyConnections    503      limits.max_connections[_per_client] reached (Retry-After)
      UpstreamError         502      a replica failed; `reason` is the metric label
        UpstreamConnectError         connect failed or timed out, or the connection broke
                                     (refused, reset, closed)
        UpstreamTimeout     504      first byte or idle timeout

Every UpstreamError carries ``before_response``: True when it happened before anything was sent
to the client (connect, response headers, first body chunk). Only those are retried on the next
candidate; the failed exchange's connection is closed, so vLLM aborts whatever it started.

`translate_upstream()` maps aiohttp/asyncio/OS exceptions to the `UpstreamError` family
(`raise ... from exc`), so the proxy reasons only about our types. `error_body()` is the JSON
body; `sse_error_event()` is the in-band form used once a stream has started and a status code
can no longer be sent. Bodies are built with json.dumps only (messages never contain prompt text).
The connection-level ones (408, 414, 431, TooManyConnections) are answered by the protocol layer
(`router/limits.py`) before or outside an ASGI request, from `raw_response()`.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from types import TracebackType

import aiohttp

__all__ = [
    "HeaderFieldsTooLarge", "InvalidRequest", "ModelNotFound", "NoReplicaAvailable", "NotFound",
    "PayloadTooLarge", "RequestTimeout", "RouterError", "StreamCancelled", "TooManyConnections",
    "TooManyRequests", "Unauthorized", "UpstreamConnectError", "UpstreamError", "UpstreamTimeout",
    "UriTooLong", "error_body", "raw_response", "sse_error_event", "translate_upstream",
    "upstream_error"
]


class RouterError(Exception):
    status = 500
    type = "server_error"
    code = "internal_error"

    def __init__(self, message: str, *, code: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def payload(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": None,
                          "code": self.code}}

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = [(b"content-type", b"application/json")]
        if self.retry_after is not None:
            out.append((b"retry-after", str(self.retry_after).encode()))
        return out


class InvalidRequest(RouterError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(RouterError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class NotFound(RouterError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    """A model no replica serves. The message names neither the model nor any replica."""

    code = "model_not_found"

    def __init__(self) -> None:
        super().__init__("the model does not exist on any replica of this router; "
                         "GET /v1/models lists the models served")

    def payload(self) -> dict[str, object]:
        body = super().payload()
        body["error"]["param"] = "model"  # type: ignore[index]
        return body


class RequestTimeout(RouterError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(RouterError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UriTooLong(RouterError):
    status = 414
    type = "invalid_request_error"
    code = "request_line_too_long"


class HeaderFieldsTooLarge(RouterError):
    status = 431
    type = "invalid_request_error"
    code = "request_header_fields_too_large"


class TooManyRequests(RouterError):
    status = 429
    type = "rate_limit_error"
    code = "router_overloaded"


class NoReplicaAvailable(RouterError):
    status = 503
    type = "server_error"
    code = "no_replica_available"


class TooManyConnections(RouterError):
    status = 503
    type = "server_error"
    code = "too_many_connections"


class StreamCancelled(RouterError):
    """A started stream the router itself had to end: its shutdown grace period ran out."""

    status = 503
    type = "server_error"
    code = "stream_cancelled"


class UpstreamError(RouterError):
    status = 502
    type = "server_error"
    code = "upstream_error"
    reason = "protocol"
    before_response = False  # set by translate_upstream for the phases before the first byte


class UpstreamConnectError(UpstreamError):
    code = "upstream_unreachable"
    reason = "connect"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"
    reason = "timeout"


def error_body(err: RouterError) -> bytes:
    return json.dumps(err.payload()).encode()


def raw_response(err: RouterError) -> bytes:
    """The whole HTTP/1.1 response for `err`, ending the connection (`Connection: close`): what
    the protocol layer writes when there is no ASGI request to answer through."""
    body = error_body(err)
    head = [f"HTTP/1.1 {err.status} {HTTPStatus(err.status).phrase}".encode()]
    head += [name + b": " + value for name, value in err.headers()]
    head += [b"content-length: " + str(len(body)).encode(), b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body



def sse_error_event(err: RouterError) -> bytes:
    return b"data: " + error_body(err) + b"\n\n"


def upstream_error(exc: BaseException, replica: str, phase: str,
                   before_response: bool = False) -> UpstreamError | None:
    """The UpstreamError a transport failure talking to ``replica`` becomes (``phase`` is for
    the message); None when ``exc`` is already one, is not an Exception (cancellation) or is
    not a transport failure: it then propagates unchanged. `translate_upstream` as a function,
    for a ``try``/``except`` on the proxy's hot path (free while nothing is raised)."""
    if isinstance(exc, UpstreamError) or not isinstance(exc, Exception):
        return None
    where = f"replica {replica}"
    err: UpstreamError
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        # the TCP connect timed out: the replica never saw the request, like a refusal
        err = UpstreamConnectError(f"{where} unreachable ({phase}: connect timeout)")
    elif isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        err = UpstreamTimeout(f"{where} timed out ({phase})")
    elif isinstance(exc, aiohttp.ClientConnectionError | ConnectionError):
        # connection refused/reset/closed: the replica never produced a response we relayed
        err = UpstreamConnectError(f"{where} unreachable ({phase})")
    elif isinstance(exc, aiohttp.ClientError | OSError):
        err = UpstreamError(f"{where} failed ({phase}: {type(exc).__name__})")
    else:
        return None
    err.before_response = before_response
    return err


class translate_upstream:
    """Re-raise transport failures talking to `replica` as UpstreamError (`phase` is for the
    message; the mapping is `upstream_error`'s). A class rather than @contextmanager: a
    generator-based context manager costs several times more."""

    __slots__ = ("before_response", "phase", "replica")

    def __init__(self, replica: str, phase: str, before_response: bool = False) -> None:
        self.replica = replica
        self.phase = phase
        self.before_response = before_response

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            return
        err = upstream_error(exc, self.replica, self.phase, self.before_response)
        if err is not None:
            raise err from exc
