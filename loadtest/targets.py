"""Issue #18's "done when" verdicts, computed from saved benchmark results. Pure: dicts in, values out.

Compare (`make bench`, simulated fleet over HTTP): for every cell (a workload at a fleet size)
the router's default policy (``ours``) is held against sglang-router ``cache_aware`` and the
router's ``round_robin`` measured in the same run on the same requests:

* hit rate >= sglang cache_aware's;
* TTFT p99 <= sglang cache_aware's, and the geometric mean over the cells of a fleet size (and
  over all cells) of ours / sglang's <= `GEOMEAN_P99`;
* TTFT p99 <= round-robin's;
* max/mean requests per replica <= `MAX_LOAD`;
* both of the first and the last at once: ``joint_ok`` holds the cell's hit bound at max/mean
  <= `MAX_LOAD` (`loadtest.balance_bound.hit_bound`: the best hit rate ANY router reaches while
  no replica gets more than `MAX_LOAD` x the mean requests, from the requests alone) against
  sglang cache_aware's measured hit rate. Below it, no router meets the two targets together
  on that cell; at or above it, the bound does not rule them out (it does not say they are
  reachable).

Simulation (`prefix-loadtest simulate`, 64 replicas): a policy meets the fleet-scale target when
its hit rate is >= `OF_CEILING` x the one-cache ceiling of the same requests at max/mean load
<= `MAX_LOAD`.

A verdict is ``True`` (met), ``False`` (missed) or ``None`` (not measured: a setup is missing or
a value is not a number), never a default.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GEOMEAN_P99", "MAX_LOAD", "OF_CEILING", "ROUND_ROBIN", "SGLANG", "Cell", "SimRow",
           "cells", "geomean", "geomeans", "sim_rows"]

SGLANG, ROUND_ROBIN = "sglang-cache_aware", "router-round_robin"
GEOMEAN_P99 = 0.8   # geometric mean of (our TTFT p99 / sglang's) at most this
MAX_LOAD = 1.3      # max/mean requests per replica at most this
OF_CEILING = 0.95   # simulation: hit rate at least this fraction of the one-cache ceiling


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return None if math.isnan(v) or math.isinf(v) else float(v)


def _le(a: float | None, b: float | None) -> bool | None:
    return None if a is None or b is None else a <= b


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


@dataclass(frozen=True)
class Cell:
    """One workload at one fleet size: ours against the references, and the verdicts."""

    key: str  # the results' workload key
    workload: str
    replicas: int | None
    ours: str
    hit: float | None = None
    sglang_hit: float | None = None
    ceiling: float | None = None
    p99: float | None = None
    sglang_p99: float | None = None
    rr_p99: float | None = None
    load: float | None = None
    bound: float | None = None  # hit_bound at max/mean <= MAX_LOAD (None: not computed)

    @property
    def hit_ok(self) -> bool | None:
        return _le(self.sglang_hit, self.hit)

    @property
    def p99_ratio(self) -> float | None:
        return _ratio(self.p99, self.sglang_p99)

    @property
    def p99_ok(self) -> bool | None:
        return _le(self.p99, self.sglang_p99)

    @property
    def rr_ok(self) -> bool | None:
        return _le(self.p99, self.rr_p99)

    @property
    def load_ok(self) -> bool | None:
        return _le(self.load, MAX_LOAD)

    @property
    def of_ceiling(self) -> float | None:
        return _ratio(self.hit, self.ceiling)

    @property
    def joint_ok(self) -> bool | None:
        """False when no router can meet hit rate >= sglang's and max/mean <= MAX_LOAD together
        (the bound at MAX_LOAD is below sglang's measured hit rate); True when the bound does
        not rule it out; None when either is missing."""
        return _le(self.sglang_hit, self.bound)


def _bound(block: Mapping[str, Any]) -> float | None:
    """The cell's hit bound at max/mean <= MAX_LOAD (`bench.run_compare`'s ``bounds``), if it
    was computed for that target."""
    b = block.get("bounds") or {}
    if _num(b.get("target")) != MAX_LOAD:
        return None
    return _num((b.get("at_target") or {}).get("hit_rate"))


def _p99(summary: Mapping[str, Any] | None) -> float | None:
    return None if summary is None else _num((summary.get("ttft") or {}).get("p99"))


def cells(results: Mapping[str, Any], ours: str) -> list[Cell]:
    """A `Cell` per workload of a compare run in which ``ours`` was measured."""
    out = []
    for key, block in (results.get("workloads") or {}).items():
        setups = block.get("setups") or {}
        mine = setups.get(ours)
        if mine is None:
            continue
        theirs, rr = setups.get(SGLANG), setups.get(ROUND_ROBIN)
        replicas = (block.get("fleet") or results.get("fleet") or {}).get("replicas")
        out.append(Cell(
            key=key, workload=str((block.get("workload") or {}).get("name", key)),
            replicas=replicas if isinstance(replicas, int) else None, ours=ours,
            hit=_num(mine.get("hit_rate")),
            sglang_hit=None if theirs is None else _num(theirs.get("hit_rate")),
            ceiling=_num((block.get("ceiling") or {}).get("hit_rate")),
            p99=_p99(mine), sglang_p99=_p99(theirs), rr_p99=_p99(rr),
            load=_num(mine.get("load_max_over_mean")), bound=_bound(block)))
    return out


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of positive values; None if any is missing (a partial mean would hide
    the cell that failed) or there are none."""
    vals = list(values)
    if not vals or any(v is None or v <= 0 for v in vals):
        return None
    return math.exp(sum(math.log(v) for v in vals if v is not None) / len(vals))


def geomeans(rows: Sequence[Cell]) -> dict[str, float | None]:
    """Geometric mean of TTFT p99 ÷ sglang's per fleet size (``"4"``, ``"8"``) and over all
    cells (``"all"``)."""
    out: dict[str, float | None] = {}
    for n in sorted({r.replicas for r in rows if r.replicas is not None}):
        out[str(n)] = geomean(r.p99_ratio for r in rows if r.replicas == n)
    out["all"] = geomean(r.p99_ratio for r in rows)
    return out


@dataclass(frozen=True)
class SimRow:
    workload: str
    policy: str
    hit: float | None
    ceiling: float | None
    load: float | None

    @property
    def of_ceiling(self) -> float | None:
        return _ratio(self.hit, self.ceiling)

    @property
    def ok(self) -> bool | None:
        """>= OF_CEILING of the ceiling at max/mean <= MAX_LOAD."""
        a, b = _le(OF_CEILING, self.of_ceiling), _le(self.load, MAX_LOAD)
        return None if a is None or b is None else a and b


def sim_rows(workload: str, results: Sequence[Mapping[str, Any]]) -> list[SimRow]:
    """A row per policy of one simulated workload (`SimResult.to_json()` dicts)."""
    return [SimRow(workload, str(r["config"]["policy"]), _num(r.get("hit_rate")),
                   _num((r.get("ceiling") or {}).get("hit_rate")),
                   _num(r.get("load_max_over_mean"))) for r in results]
