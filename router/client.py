"""Client side of the ``X-Prefix-Hash`` override: compute the router's key before sending.

A client (or an SDK wrapper) that hashes its own request with :func:`hash_key` and sends the
result as ``X-Prefix-Hash`` gets the same home replica the router would have derived from the
body - it runs :func:`router.keys.derive` itself, so the two cannot drift. Useful when the body
is not visible to the router (encrypted payloads, gRPC bridges) or to pin several distinct
requests to one key on purpose.

:func:`routing_headers` adds ``X-Model`` (the body's ``model``): nginx cannot read JSON bodies,
so an nginx rendered by ``prefix-router nginx-config`` for a multi-model fleet picks the model's
upstream from that header (the router itself reads the body and ignores it).

Cost: one JSON parse when given bytes/str, then the cost of ``derive``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from router.keys import KeyConfig, KeySource, derive

__all__ = ["MODEL_HEADER", "hash_key", "prefix_headers", "routing_headers"]

CHAT_PATH = "/v1/chat/completions"
MODEL_HEADER = "X-Model"


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


def routing_headers(
    body: Mapping[str, Any] | bytes | str,
    path: str = CHAT_PATH,
    config: KeyConfig = KeyConfig(),
) -> dict[str, str]:
    """`prefix_headers` plus ``{"X-Model": model}`` when the body names a model."""
    parsed = _parse(body)
    if parsed is None:
        return {}
    headers = prefix_headers(parsed, path, config)
    model = parsed.get("model")
    if isinstance(model, str) and model:
        headers[MODEL_HEADER] = model
    return headers


def _parse(body: Mapping[str, Any] | bytes | str) -> Mapping[str, Any] | None:
    if isinstance(body, Mapping):
        return body
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, Mapping) else None
