"""`is_secret`: does a whole value look like a credential (API key, bearer token, JWT)?

The value must be exactly one token of a secret detector (`patterns.SECRET`, `patterns.JWT`)
and pass its validity check: the variable part looks random (not `sk-xxxx…` or `YOUR_KEY`),
and a JWT's header and payload base64url-decode to JSON objects. Cost: O(len(value)).
"""

from __future__ import annotations

from .patterns import JWT, SECRET


def is_secret(value: str) -> bool:
    """True if `value` (surrounding whitespace ignored) is a credential-shaped token."""
    token = value.strip()
    for det in (JWT, SECRET):
        for pattern in det.patterns:
            m = pattern.fullmatch(token)
            if m is not None and (det.validate is None or det.validate(m, token)):
                return True
    return False
