"""The Envoy ext_proc messages of the endpoint picker protocol, read and built. Pure.

Protocol: Gateway API Inference Extension, "Endpoint Picker Protocol" v1.0.0 (2025-07-29,
``docs/proposals/004-endpoint-picker-protocol`` of kubernetes-sigs/gateway-api-inference-
extension), over ``envoy.service.ext_proc.v3`` (the xds-protos package):

- request: the gateway MAY name the candidates in the request's ``metadata_context``,
  ``filter_metadata["envoy.lb.subset_hint"]["x-gateway-destination-endpoint-subset"]`` (a
  list of ``ip:port``); the EPP then picks only among them (none eligible: 503);
- answer: the picked endpoints, ``ip:port[,ip:port...]`` (the pick first, then the order the
  gateway retries in), both as the request header ``x-gateway-destination-endpoint`` and in
  the response's ``dynamic_metadata["envoy.lb"]["x-gateway-destination-endpoint"]`` - always
  the same value; no endpoint: an ``ImmediateResponse`` (503, or the error's own status);
- response: the gateway reports the endpoint that served in ``metadata_context``,
  ``filter_metadata["envoy.lb"]["x-gateway-destination-endpoint-served"]``.

Header values are read from ``raw_value`` (what Envoy sends) or else ``value``; header names are
lowercased. Nothing here raises on a malformed message: an absent or mistyped field reads as
absent. Cost: O(headers) per headers message, O(subset) per hint.
"""

from __future__ import annotations

from collections.abc import Iterable

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    BodyMutation,
    BodyResponse,
    CommonResponse,
    HeaderMutation,
    HeadersResponse,
    HttpHeaders,
    ImmediateResponse,
    ProcessingRequest,
    ProcessingResponse,
    StreamedBodyResponse,
    TrailersResponse,
)
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.protobuf.struct_pb2 import Struct

from router.errors import RouterError, error_body

__all__ = [
    "DESTINATION", "SERVED", "SUBSET", "SUBSET_NAMESPACE", "continue_body", "continue_headers",
    "continue_trailers", "header_pairs", "immediate", "pick_in_body", "pick_in_headers",
    "served_endpoint", "streamed_body", "subset_hint"
]

DESTINATION = "x-gateway-destination-endpoint"
SUBSET = "x-gateway-destination-endpoint-subset"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"


def header_pairs(headers: HttpHeaders) -> list[tuple[bytes, bytes]]:
    """``(lowercase name, value)`` of an ext_proc headers message, pseudo-headers included."""
    return [(h.key.lower().encode("latin-1", "replace"),
             h.raw_value if h.raw_value else h.value.encode("latin-1", "replace"))
            for h in headers.headers.headers]


def _strings(value: object) -> list[str]:
    """The endpoint strings of a metadata value: a list of strings, or one comma list."""
    kind = value.WhichOneof("kind")  # type: ignore[attr-defined]
    if kind == "string_value":
        text: str = value.string_value  # type: ignore[attr-defined]
        return [p.strip() for p in text.split(",") if p.strip()]
    if kind == "list_value":
        out = []
        for item in value.list_value.values:  # type: ignore[attr-defined]
            if item.WhichOneof("kind") == "string_value":
                out += [p.strip() for p in item.string_value.split(",") if p.strip()]
        return out
    return []


def _entry(request: ProcessingRequest, namespace: str, key: str) -> object | None:
    if not request.HasField("metadata_context"):
        return None
    ns = request.metadata_context.filter_metadata
    if namespace not in ns:
        return None
    fields = ns[namespace].fields
    return fields[key] if key in fields else None


def subset_hint(request: ProcessingRequest) -> frozenset[str] | None:
    """The gateway's candidate endpoints (``ip:port``), or None when it set no hint. A hint
    that is present but empty or unreadable is an empty set (the EPP then answers 503)."""
    value = _entry(request, SUBSET_NAMESPACE, SUBSET)
    return None if value is None else frozenset(_strings(value))


def served_endpoint(request: ProcessingRequest, namespace: str) -> str | None:
    """The endpoint the gateway reports as having served the request, or None."""
    value = _entry(request, namespace, SERVED)
    found = [] if value is None else _strings(value)
    return found[0] if found else None


def _set_headers(pairs: Iterable[tuple[str, bytes]]) -> HeaderMutation:
    return HeaderMutation(set_headers=[
        HeaderValueOption(header=HeaderValue(key=k, raw_value=v),
                          append_action=HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)
        for k, v in pairs])


def _pick(endpoints: str) -> CommonResponse:
    # clear_route_cache: the gateway may route on the new header
    return CommonResponse(header_mutation=_set_headers([(DESTINATION, endpoints.encode())]),
                          clear_route_cache=True)


def _metadata(namespace: str, endpoints: str) -> Struct:
    meta = Struct()
    meta.update({namespace: {DESTINATION: endpoints}})
    return meta


def pick_in_headers(endpoints: str, namespace: str) -> ProcessingResponse:
    """The answer to the request headers that names the endpoints (FULL_DUPLEX_STREAMED, or a
    request without a body)."""
    return ProcessingResponse(request_headers=HeadersResponse(response=_pick(endpoints)),
                              dynamic_metadata=_metadata(namespace, endpoints))


def pick_in_body(endpoints: str, namespace: str) -> ProcessingResponse:
    """The answer to a buffered request body that names the endpoints: the header mutation
    applies to the request headers, which the gateway holds while it buffers the body."""
    return ProcessingResponse(request_body=BodyResponse(response=_pick(endpoints)),
                              dynamic_metadata=_metadata(namespace, endpoints))


def continue_headers(response_phase: bool) -> ProcessingResponse:
    if response_phase:
        return ProcessingResponse(response_headers=HeadersResponse())
    return ProcessingResponse(request_headers=HeadersResponse())


def continue_body(response_phase: bool) -> ProcessingResponse:
    if response_phase:
        return ProcessingResponse(response_body=BodyResponse())
    return ProcessingResponse(request_body=BodyResponse())


def continue_trailers(response_phase: bool) -> ProcessingResponse:
    if response_phase:
        return ProcessingResponse(response_trailers=TrailersResponse())
    return ProcessingResponse(request_trailers=TrailersResponse())


def streamed_body(response_phase: bool, body: bytes, end_of_stream: bool) -> ProcessingResponse:
    """A body chunk sent back unchanged (FULL_DUPLEX_STREAMED: the gateway forwards exactly
    the bytes the processor returns)."""
    common = CommonResponse(body_mutation=BodyMutation(
        streamed_response=StreamedBodyResponse(body=body, end_of_stream=end_of_stream)))
    if response_phase:
        return ProcessingResponse(response_body=BodyResponse(response=common))
    return ProcessingResponse(request_body=BodyResponse(response=common))


def immediate(err: RouterError) -> ProcessingResponse:
    """The gateway answers the client with ``err`` (its status, headers and OpenAI error body)
    instead of forwarding the request."""
    return ProcessingResponse(immediate_response=ImmediateResponse(
        status=HttpStatus(code=err.status),  # type: ignore[arg-type]
        headers=_set_headers((n.decode("latin-1"), v) for n, v in err.headers()),
        body=error_body(err), details=err.code))
