"""Replica roles for prefill/decode disaggregation: the vocabulary, declared once.

A replica is a ``prefill`` instance, a ``decode`` instance or ``both`` (the default: an ordinary
vLLM replica, or a ``kv_both`` one that serves either phase). The role comes from
``replicas[].role`` (static), the DNS name it was resolved from (``discovery.dns.prefill`` /
``decode``) or the EndpointSlice label `ROLE_LABEL`; `router.disagg_routing` splits a model pool
by it. Pure values, no imports from the rest of the router.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["DEFAULT_ROLE", "ROLES", "ROLE_LABEL", "Role", "role_of"]


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"


ROLES = tuple(r.value for r in Role)
DEFAULT_ROLE = Role.BOTH
# the Kubernetes label naming a Service's (so its EndpointSlices') role
ROLE_LABEL = "prefix-router.io/role"


def role_of(value: object) -> Role | None:
    """The role a string names, None for anything else."""
    if isinstance(value, str):
        try:
            return Role(value)
        except ValueError:
            return None
    return None
