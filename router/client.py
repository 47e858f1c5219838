"""Client side of the ``X-Prefix-Hash`` override: compute the router's key before sending.

A client (or an SDK wrapper) that hashes its own request with :func:`hash_key` and sends the
result as ``X-Prefix-Hash`` gets the same home replica the router would have derived from the
body - it runs :func:`router.keys.derive` itself, so the two cannot drift. Useful when the body
is not visible to the router (encrypted payloads, gRPC bridges) or to pin several distinct
requests to one key on purpose.

Cost: one JSON parse when given bytes/str, then the cost of ``derive``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from router.keys import KeyConfig, KeySource, derive

__all__ = ["hash_key", "prefix_headers"]

CHAT_PATH = "/v1/chat/completions"


def hash_key(
    body: Mapping[str, Any] | bytes | str,
    path: str = CHAT_PATH,
    config: KeyConfig = KeyConfig(),
) -> str | None:
    """The prefix key the router derives for ``body``; ``None`` when the cacheable prefix is
    shorter than ``config.min_prefix_chars`` (the router then routes by conversation)."""
    parsed = _parse(body)
    if parsed is None:
        return None
    key = derive(path, {}, parsed, config)
    return key.prefix if key.source is KeySource.PREFIX else None


def prefix_headers(
    body: Mapping[str, Any] | bytes | str,
    path: str = CHAT_PATH,
    config: KeyConfig = KeyConfig(),
) -> dict[str, str]:
    """``{"X-Prefix-Hash": key}``, or ``{}`` when there is no prefix key."""
    key = hash_key(body, path, config)
    return {} if key is None else {"X-Prefix-Hash": key}


def _parse(body: Mapping[str, Any] | bytes | str) -> Mapping[str, Any] | None:
    if isinstance(body, Mapping):
        return body
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, Mapping) else None
