"""Fault injection: what the replica does wrong, and the per-request draw.

A `FaultSpec` is a value (set from flags at start, replaced as a whole by `POST /admin/fault`).
`Faults.draw()` decides, per arriving request, whether it is answered normally, with an error
status, hangs, or triggers a process exit; the draws use one seeded RNG so a run is reproducible.
Slow-down and stop-after-K-chunks apply to every request while set; refusing connections is a
listener action carried out by the server process. O(1) per request.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any


class Action(StrEnum):
    SERVE = "serve"
    ERROR = "error"
    HANG = "hang"
    EXIT = "exit"


@dataclass(frozen=True)
class FaultSpec:
    error_rate: float = 0.0
    error_status: int = 500
    hang_rate: float = 0.0
    slow: float = 1.0
    stop_after: int | None = None   # stream chunks (or body bytes halves) before an abrupt close
    refuse: bool = False
    refuse_seconds: float | None = None   # reopen by itself after this long
    exit_after: int | None = None   # exit when the N-th request (counted from now) arrives
    exit_code: int = 1
    exit: bool = False   # exit right after answering the admin request that sets it
    health_status: int | None = None   # /health answers this (vLLM: 500 once its engine died)

    def __post_init__(self) -> None:
        if not (0 <= self.error_rate <= 1 and 0 <= self.hang_rate <= 1):
            raise ValueError("error_rate and hang_rate must be within [0, 1]")
        if not 400 <= self.error_status <= 599:
            raise ValueError(f"error_status must be 4xx/5xx, got {self.error_status}")
        if self.slow <= 0:
            raise ValueError(f"slow must be > 0, got {self.slow}")
        if self.health_status is not None and not 200 <= self.health_status <= 599:
            raise ValueError(f"health_status must be an HTTP status, got {self.health_status}")
        if self.stop_after is not None and self.stop_after < 0:
            raise ValueError("stop_after must be >= 0")

    @classmethod
    def from_json(cls, data: Any) -> FaultSpec:
        if not isinstance(data, dict):
            raise ValueError("fault spec must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown fault field(s): {', '.join(unknown)}; known: {sorted(known)}")
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    action: Action
    status: int = 200


_SERVE = Verdict(Action.SERVE)
_HANG = Verdict(Action.HANG)
_EXIT = Verdict(Action.EXIT)


class Faults:
    """The current spec plus the request counter and RNG its draws use."""

    def __init__(self, spec: FaultSpec | None = None, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self.spec = spec or FaultSpec()
        self._since_set = 0

    def set(self, spec: FaultSpec) -> None:
        self.spec = spec
        self._since_set = 0

    def draw(self) -> Verdict:
        spec = self.spec
        self._since_set += 1
        if spec.exit_after is not None and self._since_set >= spec.exit_after:
            return _EXIT
        if spec.error_rate and self._rng.random() < spec.error_rate:
            return Verdict(Action.ERROR, spec.error_status)
        if spec.hang_rate and self._rng.random() < spec.hang_rate:
            return _HANG
        return _SERVE
