"""Volatile-token detectors shared by the router (hot path) and the auditor.

Standard library only. Public API: `Kind`, `Match`, `scan`, `first_volatile`, `ROUTER_KINDS`,
`classify`, `is_secret`; the detectors themselves (`DETECTORS`, `Detector`) are data, exported
for inspection and documentation. See docs/detectors.md.
"""

from __future__ import annotations

from .classify import classify
from .credentials import is_secret
from .kinds import LONG_LIVED_DETECTORS, Kind, Match
from .patterns import DETECTORS, Detector
from .scan import ROUTER_KINDS, first_volatile, scan

__all__ = [
    "DETECTORS",
    "LONG_LIVED_DETECTORS",
    "ROUTER_KINDS",
    "Detector",
    "Kind",
    "Match",
    "classify",
    "first_volatile",
    "is_secret",
    "scan",
]
