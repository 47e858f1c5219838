"""Request body handling for the /v1 endpoints: read it under a size limit, then parse and
shape-check the JSON once (the parsed object feeds the routing key; the raw bytes are sent on).

Parsing goes through `templates_audit.jsonfast.loads`: orjson when it is installed and its value
is certainly json.loads's, else json.loads itself - so what is accepted, rejected and routed is
exactly what json.loads decides (the 1.5 KB overhead body: ~10 -> ~4 us)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prefix_asgi import BodyTooLarge, ClientGone, Receive
from prefix_asgi import read_body as read_all
from router.errors import InvalidRequest, PayloadTooLarge
from templates_audit.jsonfast import loads

__all__ = ["PROMPT_FIELDS", "ClientGone", "read_body", "validate_body"]

# Required prompt field per validated endpoint and the JSON types it may take.
PROMPT_FIELDS: dict[str, tuple[str, tuple[type, ...]]] = {
    "/v1/chat/completions": ("messages", (list,)),
    "/v1/completions": ("prompt", (str, list)),
    "/v1/embeddings": ("input", (str, list)),
}
_OPTIONAL_TYPES: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("model", (str,), "a string"),
    ("stream", (bool,), "a boolean"),
)


async def read_body(receive: Receive, headers: Iterable[tuple[bytes, bytes]], limit: int) -> bytes:
    """The whole request body; PayloadTooLarge as soon as Content-Length or the bytes read so far
    exceed `limit` (a lying or absent Content-Length cannot get past it)."""
    for name, value in headers:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise InvalidRequest("invalid Content-Length",
                                     code="invalid_content_length") from None
            if declared > limit:
                raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of "
                                      f"{limit} bytes")
            break
    try:
        return await read_all(receive, limit)
    except BodyTooLarge as exc:
        raise PayloadTooLarge(str(exc)) from None


def validate_body(path: str, headers: Iterable[tuple[bytes, bytes]],
                  body: bytes) -> dict[str, Any]:
    """Parse and shape-check the JSON body of a completions-style POST (400 on any problem)."""
    for name, value in headers:
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            if media != b"application/json":
                raise InvalidRequest(f"Content-Type must be application/json, got "
                                     f"{media.decode('latin-1')!r}", code="invalid_content_type")
            break
    try:
        parsed = loads(body)
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("request body is not valid JSON", code="invalid_json") from None
    except RecursionError:  # nesting deeper than the interpreter's recursion limit
        raise InvalidRequest("request body is nested too deeply", code="invalid_json") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_body")
    field, types = PROMPT_FIELDS[path]
    if field not in parsed:
        raise InvalidRequest(f"missing required field '{field}'", code="missing_field")
    if not isinstance(parsed[field], types) or not parsed[field]:
        kinds = " or ".join("a non-empty array" if t is list else "a string" for t in types)
        raise InvalidRequest(f"'{field}' must be {kinds}", code="invalid_type")
    if field == "messages" and not all(isinstance(m, dict) for m in parsed["messages"]):
        raise InvalidRequest("'messages' must be an array of objects", code="invalid_type")
    for opt, want, desc in _OPTIONAL_TYPES:
        if opt in parsed and parsed[opt] is not None and not isinstance(parsed[opt], want):
            raise InvalidRequest(f"'{opt}' must be {desc}", code="invalid_type")
    return parsed
