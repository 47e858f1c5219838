"""Value types of the detectors: the `Kind` enum and the `Match` finding.

`Kind` values are API (metric labels, JSON values): never rename one. `Match.detector` names the
pattern that caught the value (Drain3-style named masks), so a finding can be traced back to the
rule that produced it, and so callers can tell long-lived values (a knowledge cutoff, the current
year) from per-request/per-day ones without a second kind taxonomy.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Kind(StrEnum):
    TIMESTAMP = "timestamp"
    DATE = "date"
    TIME = "time"
    UUID = "uuid"
    HEX_ID = "hex_id"
    NUMERIC_ID = "numeric_id"
    NAME = "name"
    EMAIL = "email"
    VERSION = "version"
    SECRET = "secret"
    REORDERED_BLOCK = "reordered_block"
    WHITESPACE = "whitespace"
    OTHER = "other"
    # Decided by the auditor across requests (slots.py), never by classify():
    SAMPLED_BLOCK = "sampled_block"  # lines drawn from a small pool, set and order per request
    VARIANT = "variant"  # a few values, each its own cached prefix: not a per-request breaker


# Detectors whose values change per release/config or per year (or never: a fixed event's
# date), not per request/day/session.
# The auditor still reports them when they vary; the router does not cut its key there, because
# they are constant for a deployment and cutting would only make the routing key less specific.
KNOWLEDGE_CUTOFF = "knowledge_cutoff"
CURRENT_YEAR = "current_year"
EVENT_DATE = "event_date"  # "founded on …", "born on …": a fixed date in prose
LONG_LIVED_DETECTORS: frozenset[str] = frozenset({KNOWLEDGE_CUTOFF, CURRENT_YEAR, EVENT_DATE})


class Match(NamedTuple):
    """One detected value: `text[start:end] == value`; `detector` is the named pattern (a
    named tuple: one is built per value found, on the router's path too)."""

    kind: Kind
    start: int
    end: int
    value: str
    detector: str

    @property
    def long_lived(self) -> bool:
        """True for per-release/per-year/constant values (knowledge cutoff, current year,
        a fixed event's date): the router does not cut there."""
        return self.detector in LONG_LIVED_DETECTORS
