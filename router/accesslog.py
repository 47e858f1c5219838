"""One JSON line per proxied request on the `prefix_router.access` logger.

Fields: method, path (without the query string), status, replica, branch, key_source, attempts,
ttfb_ms, duration_ms, bytes_in, bytes_out. Never the body, prompt text, headers or tokens: the
record type has no field that could hold them. Status 499 marks a client that went away.
Cost: one json.dumps per request, skipped entirely when the logger is disabled.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

log = logging.getLogger("prefix_router.access")

CLIENT_CLOSED = 499


@dataclass(slots=True)
class AccessRecord:
    method: str
    path: str
    status: int = 0
    replica: str | None = None
    branch: str | None = None
    key_source: str | None = None
    attempts: int = 0
    ttfb_ms: float | None = None
    duration_ms: float = 0.0
    bytes_in: int = 0
    bytes_out: int = 0


def emit(record: AccessRecord) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info(json.dumps(asdict(record), separators=(",", ":")))
