"""Issue #18's verdicts (loadtest.targets) and their tables, case by case."""

from __future__ import annotations

import math
from typing import Any

import pytest

from loadtest.report import sim_targets_markdown, targets_markdown
from loadtest.targets import Cell, SimRow, cells, geomean, geomeans, sim_rows

NAN = math.nan

# (hit, sglang hit, p99, sglang p99, round-robin p99, max/mean load)
#   -> (hit >= sglang, p99 <= sglang, p99 <= round-robin, load <= 1.3)
CELLS = [
    ((0.90, 0.85, 0.4, 0.6, 0.8, 1.20), (True, True, True, True)),     # better everywhere
    ((0.85, 0.85, 0.6, 0.6, 0.6, 1.30), (True, True, True, True)),     # ties and 1.3 are met
    ((0.84, 0.85, 0.61, 0.6, 0.6, 1.31), (False, False, False, False)),  # just past every bound
    ((0.90, None, 0.4, None, 0.5, 1.0), (None, None, True, True)),     # sglang not measured
    ((NAN, 0.85, 0.4, 0.6, None, NAN), (None, True, None, None)),      # NaN is not a number
    ((0.90, 0.85, 0.9, 0.6, 0.5, 4.0), (True, False, False, False)),   # melts one replica
]


@pytest.mark.parametrize(("values", "verdicts"), CELLS)
def test_cell_verdicts(values: tuple[Any, ...], verdicts: tuple[bool | None, ...]) -> None:
    hit, shit, p99, sp99, rr, load = values
    c = cells(_results({"router-cache_aware": _summary(hit, p99, load),
                        **({"sglang-cache_aware": _summary(shit, sp99, 1.0)} if shit else {}),
                        **({"router-round_robin": _summary(0.4, rr, 1.0)} if rr else {})}),
              "router-cache_aware")[0]
    assert (c.hit_ok, c.p99_ok, c.rr_ok, c.load_ok) == verdicts


def test_cells_read_ours_the_fleet_size_and_the_ceiling() -> None:
    res = _results({"router-cache_aware": _summary(0.9, 0.3, 1.1),
                    "sglang-cache_aware": _summary(0.8, 0.6, 1.5)}, replicas=8, ceiling=0.95)
    res["workloads"]["no ours"] = {"setups": {"router-prefix": _summary(0.5, 1.0, 1.0)}}
    (c,) = cells(res, "router-cache_aware")  # a cell without the judged setup is left out
    assert (c.key, c.workload, c.replicas, c.ours) == ("w, 8", "w", 8, "router-cache_aware")
    assert c.p99_ratio == pytest.approx(0.5) and c.of_ceiling == pytest.approx(0.9 / 0.95)
    assert cells(res, "router-prefix")[0].key == "no ours"


# ratios -> geometric mean (None: a missing cell is not averaged away)
GEOMEANS = [
    ([0.5, 2.0], 1.0),
    ([0.64, 1.0], 0.8),
    ([0.7], 0.7),
    ([0.5, None], None),
    ([], None),
    ([0.0, 1.0], None),
]


@pytest.mark.parametrize(("ratios", "expected"), GEOMEANS)
def test_geomean(ratios: list[float | None], expected: float | None) -> None:
    got = geomean(ratios)
    assert got == (None if expected is None else pytest.approx(expected))


def test_geomeans_per_fleet_size_and_overall() -> None:
    rows = [Cell("a4", "a", 4, "o", p99=0.5, sglang_p99=1.0),
            Cell("b4", "b", 4, "o", p99=2.0, sglang_p99=1.0),
            Cell("a8", "a", 8, "o", p99=0.64, sglang_p99=1.0)]
    got = geomeans(rows)
    assert got == {"4": pytest.approx(1.0), "8": pytest.approx(0.64),
                   "all": pytest.approx((0.5 * 2.0 * 0.64) ** (1 / 3))}


# (hit, ceiling, max/mean) -> >= 0.95 of the ceiling at max/mean <= 1.3
SIM = [
    ((0.95, 1.00, 1.30), True),
    ((0.90, 0.94, 1.00), True),    # 0.957 of the ceiling
    ((0.949, 1.00, 1.00), False),
    ((0.99, 1.00, 1.31), False),   # enough hits, too uneven
    ((0.99, None, 1.00), None),    # no ceiling measured
]


@pytest.mark.parametrize(("values", "ok"), SIM)
def test_simulation_verdict(values: tuple[Any, ...], ok: bool | None) -> None:
    hit, ceiling, load = values
    (row,) = sim_rows("w", [{"config": {"policy": "p"}, "hit_rate": hit,
                             "ceiling": {"hit_rate": ceiling} if ceiling else {},
                             "load_max_over_mean": load}])
    assert row.ok is ok


def test_tables_show_values_and_verdicts() -> None:
    rows = cells(_results({"router-cache_aware": _summary(0.9, 0.3, 1.1),
                           "sglang-cache_aware": _summary(0.95, 0.6, 1.5),
                           "router-round_robin": _summary(0.5, 0.25, 1.0)}, ceiling=0.96),
                 "router-cache_aware")
    md = targets_markdown(rows)
    assert "| w | 4 | 90.0% vs 95.0%: **missed** | 0.94 | 300 vs 600 (0.50): met |" in md
    assert "| 300 vs 250: **missed** | 1.10: met |" in md
    assert "4 replicas 0.50 (met), all cells 0.50 (met)" in md
    sim = sim_targets_markdown([SimRow("w", "cache_aware", 0.9, 0.92, 1.2),
                                SimRow("w", "prefix", 0.8, 0.92, 2.0)])
    assert "| w | cache_aware | 90.0% | 92.0% | 0.98 | 1.20 | met |" in sim
    assert "| w | prefix | 80.0% | 92.0% | 0.87 | 2.00 | **missed** |" in sim


# (sglang hit, bounds as bench.run_compare saves them) -> joint_ok (both targets not ruled out)
JOINT = [
    (0.96, {"target": 1.3, "at_target": {"hit_rate": 0.9593}}, False),  # bound below sglang
    (0.96, {"target": 1.3, "at_target": {"hit_rate": 0.96}}, True),     # a tie is not ruled out
    (0.90, {"target": 1.3, "at_target": {"hit_rate": 0.95}}, True),     # room above sglang
    (0.90, {"target": 1.5, "at_target": {"hit_rate": 0.80}}, None),     # another target: unread
    (0.90, None, None),                                                  # not computed
    (None, {"target": 1.3, "at_target": {"hit_rate": 0.95}}, None),     # sglang not measured
]


@pytest.mark.parametrize(("sglang_hit", "bounds", "ok"), JOINT)
def test_joint_verdict(sglang_hit: float | None, bounds: dict[str, Any] | None,
                       ok: bool | None) -> None:
    res = _results({"router-cache_aware": _summary(0.9, 0.3, 1.1),
                    **({"sglang-cache_aware": _summary(sglang_hit, 0.6, 1.5)}
                       if sglang_hit else {})})
    if bounds is not None:
        res["workloads"]["w, 4"]["bounds"] = bounds
    (c,) = cells(res, "router-cache_aware")
    assert c.joint_ok is ok
    # the existing verdicts are unchanged by the bound
    assert c.load_ok is True and c.hit_ok is (None if sglang_hit is None else sglang_hit <= 0.9)


def test_table_says_when_both_targets_cannot_be_met() -> None:
    res = _results({"router-cache_aware": _summary(0.964, 0.3, 1.95),
                    "sglang-cache_aware": _summary(0.96, 0.4, 3.15)})
    res["workloads"]["w, 4"]["bounds"] = {"target": 1.3, "at_target": {"hit_rate": 0.9593}}
    md = targets_markdown(cells(res, "router-cache_aware"))
    assert ("| 1.95: **missed** | 95.93% < 96.00%: **both targets cannot be met together "
            "(any router)** |") in md
    assert "*Hit bound*" in md
    res["workloads"]["w, 4"]["bounds"]["at_target"]["hit_rate"] = 0.97
    assert "| 97.00% ≥ 96.00%: not ruled out |" in targets_markdown(cells(res, "router-cache_aware"))


def _summary(hit: float | None, p99: float | None, load: float) -> dict[str, Any]:
    return {"hit_rate": hit, "ttft": {"p50": 0.01, "p99": p99}, "load_max_over_mean": load}


def _results(setups: dict[str, Any], replicas: int = 4,
             ceiling: float | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"workload": {"name": "w"}, "fleet": {"replicas": replicas},
                             "setups": setups}
    if ceiling is not None:
        block["ceiling"] = {"hit_rate": ceiling}
    return {"workloads": {f"w, {replicas}": block}}
