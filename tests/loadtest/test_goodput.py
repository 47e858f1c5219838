"""`loadtest.goodput`: the rate ladder, the pass rule and the search are pure (table-driven
here); one bounded run on real simulated fleets checks the wiring: same requests at every step,
a fresh fleet per step, the search stopping at the first failing step, the block and the plot."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from loadtest.goodput import (
    Step,
    at_rate,
    goodput,
    main,
    measure,
    passes,
    render,
    search,
    step_rates,
    tighter,
    window,
)
from loadtest.plots import goodput_plot
from loadtest.workloads import CHAT, Request


def test_step_rates() -> None:
    assert step_rates(2.0, 1.5, 3) == [2.0, 3.0, 4.5]
    for bad in ((0.0, 1.5, 3), (2.0, 1.0, 3), (2.0, 1.5, 0)):
        with pytest.raises(ValueError, match="rates: expected"):
            step_rates(*bad)


def test_at_rate_keeps_the_requests_and_compresses_their_schedule() -> None:
    reqs = [Request(i, t, CHAT, {"i": i}, "g") for i, t in enumerate([0.0, 0.5, 2.0])]
    faster = at_rate(reqs, base_rate=10.0, rate=20.0)
    assert [r.at for r in faster] == [0.0, 0.25, 1.0]
    assert [(r.idx, r.body) for r in faster] == [(r.idx, r.body) for r in reqs]
    assert [r.idx for r in window(faster, 1.0)] == [0, 1]  # the arrivals before 1 s


@pytest.mark.parametrize(("step", "ok"), [
    (Step(10, 0.8, 0, 100), True),     # under the SLO, no error
    (Step(10, 1.0, 0, 100), True),     # at the SLO counts as within it
    (Step(10, 1.2, 0, 100), False),    # p99 over
    (Step(10, 0.5, 1, 100), False),    # one failed or unsent request
    (Step(10, None, 0, 100), False),   # nothing succeeded
    (Step(10, 0.5, 0, 0), False),      # nothing sent
])
def test_passes(step: Step, ok: bool) -> None:
    assert passes(step, slo=1.0) is ok


@pytest.mark.parametrize(("p99s", "ran", "best"), [
    ([0.2, 0.4, 0.9, 1.5, 0.3], 4, 30.0),   # stops at the first failing step (40); 50 never run
    ([1.5, 0.2], 1, None),                  # the lowest rate already fails
    ([0.2, 0.3], 2, 20.0),                  # every rate passes: the highest one
])
def test_search_stops_at_the_first_failure(p99s: list[float], ran: int,
                                           best: float | None) -> None:
    rates = [10.0 * (k + 1) for k in range(len(p99s))]
    calls: list[float] = []

    def run_step(rate: float) -> Step:
        calls.append(rate)
        return Step(rate, p99s[rates.index(rate)], 0, 50)

    steps = search(run_step, list(reversed(rates)), slo=1.0)  # run in rising order anyway
    assert calls == rates[:ran] and len(steps) == ran
    assert goodput(steps, slo=1.0) == best


def test_a_tighter_slo_from_the_same_steps() -> None:
    # a run at SLO 1 s ran every step up to its first failure; any tighter SLO fails no later
    steps = [{"rate": 10.0, "ttft_p99": 0.3, "errors": 0, "requests": 50},
             {"rate": 20.0, "ttft_p99": 0.6, "errors": 0, "requests": 50},
             {"rate": 30.0, "ttft_p99": 1.4, "errors": 0, "requests": 50}]
    assert [tighter(steps, x) for x in (1.0, 0.5, 0.2)] == [20.0, 10.0, None]
    res = {"workload": {"name": "w"}, "replicas": 2, "slo": 1.0, "rates": [10.0, 20.0, 30.0],
           "duration": 5.0, "seed": 0, "machine": {}, "failed": {},
           "setups": {"a": {"goodput": 20.0, "goodput_per_replica": 10.0, "ceiling": False,
                            "steps": steps}}}
    md = render([res], "cmd", extra_slos=(0.5, 2.0))  # 2.0 is looser than the run's: left out
    assert "| a | 10.00 | 300, 600, 1400 | - | 5.00 |" in md and "SLO 2 s" not in md


def test_goodput_ignores_a_pass_after_a_failure() -> None:
    steps = [Step(10, 0.2, 0, 50), Step(20, 0.2, 2, 50), Step(30, 0.2, 0, 50)]
    assert goodput(steps, slo=1.0) == 10


def test_a_bounded_run_on_real_fleets(tmp_path: Path) -> None:
    # 2 replicas, 2 rates, 3 s of traffic a step. A generous SLO: both steps pass, the goodput
    # is the higher rate; an impossible one: the first step fails and the second is never run.
    kw: dict[str, Any] = dict(workload="shared-prefix", replicas=2, start=1.0, growth=2.0,
                              steps=2, duration=3.0)
    easy = measure(setups=["router-cache_aware"], slo=60.0, workdir=tmp_path / "easy", **kw)
    hard = measure(setups=["router-round_robin"], slo=1e-6, workdir=tmp_path / "hard", **kw)
    assert easy["rates"] == hard["rates"] == [2.0, 4.0]
    ours = easy["setups"]["router-cache_aware"]
    assert [s["rate"] for s in ours["steps"]] == [2.0, 4.0]
    assert all(s["errors"] == 0 for s in ours["steps"])
    # the same stream, compressed: twice the rate, about twice the requests in the 3 s
    low, high = (s["requests"] for s in ours["steps"])
    assert 0 < low < high
    assert (ours["goodput"], ours["goodput_per_replica"], ours["ceiling"]) == (4.0, 2.0, True)
    rr = hard["setups"]["router-round_robin"]
    assert len(rr["steps"]) == 1 and rr["goodput"] is None
    md = render([easy, hard], "prefix-loadtest goodput ...")
    assert md.startswith("<!-- goodput:begin -->") and md.endswith("<!-- goodput:end -->\n")
    assert "| router-cache_aware | >= 2.00 |" in md and "| router-round_robin | none |" in md
    png = goodput_plot(easy, tmp_path / "g.png")
    assert png.stat().st_size > 1000


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(start_rate=1.0, growth=0.5, steps=2)
    assert main(args) == 2
    assert "growth > 1" in capsys.readouterr().err
