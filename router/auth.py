"""Client bearer-key check and the upstream Authorization rewrite.

`ClientAuth.check` compares the presented bearer token with every configured key using
`hmac.compare_digest` and without stopping at the first match, so the time taken does not tell
which key (or how much of one) matched. An empty key list disables auth. The router's own
`/health` and `/ready` never call it. Tokens are never logged or put in error messages.

Cost: O(number of keys * key length) per request, keys are pre-encoded once.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence

from router.errors import Unauthorized

__all__ = ["ClientAuth", "bearer_token", "upstream_authorization"]

_BEARER = b"bearer "


class ClientAuth:
    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = tuple(k.encode() for k in keys)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Raise Unauthorized unless an `Authorization: Bearer <key>` header holds a known key."""
        if not self._keys:
            return
        token = bearer_token(headers)
        if token is None:
            raise Unauthorized("missing bearer token: send 'Authorization: Bearer <key>'")
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(token, key)
        if not matched:
            raise Unauthorized("invalid API key")


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name == b"authorization":
            if value[:7].lower() == _BEARER:
                return value[7:].strip()
            return None
    return None


def upstream_authorization(key: str | None) -> tuple[bytes, bytes] | None:
    """The header that replaces the client's Authorization towards replicas, if configured."""
    return None if key is None else (b"authorization", b"Bearer " + key.encode())
