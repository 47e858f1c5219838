"""`prefix-loadtest goodput`: the request rate each setup serves within a TTFT SLO.

For one workload and fleet (a `make bench` cell, `loadtest.cells`) every setup is driven open
loop at a rising rate: step k sends ``duration`` seconds of the cell's traffic at ``rate_k =
start * growth**k`` (`step_rates`), each in front of a fresh fleet. The requests and their
arrival pattern are the same at every step and for every setup: the cell's workload is
generated once, from one seed, at the cell's rate, long enough for the highest rate; each step
compresses its times by ``cell rate / rate_k`` (`at_rate`: a Poisson process at rate r with
times scaled by r / r' is one at rate r') and sends the requests that arrive within
``duration`` (`window`) - so every step is as long as the cell's own run (its requests / its
rate) and a queue that grows faster than the fleet drains it shows up in TTFT, whatever the
rate. A step *passes* when TTFT p99 is at most the SLO and no request failed or went unsent
(`passes`). A setup's goodput is the highest rate of its passing steps before its first
failing one, per replica (`goodput`); a setup stops at its first failing step (`search`: higher
rates are not run, so a setup past its capacity costs one step, not the rest of the ladder).

Output: per setup its goodput and every step (rate, TTFT p50/p99, hit rate, errors), as JSON
(``--out``), a markdown block (``--markdown``; `render`, the ``goodput`` block of
docs/benchmarks.md when `make bench` runs it) and a plot of TTFT p99 against the rate, one line
per setup, the SLO as a horizontal line (``--plot``; `loadtest.plots.goodput_plot`).

Cost: per setup and step one fleet start, one setup start and ``duration`` seconds of traffic
(``rate x duration`` requests); at most ``steps`` runs per setup.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from loadtest.workloads import Request

__all__ = ["BLOCK", "DEFAULT_SETUPS", "Step", "add_arguments", "at_rate", "goodput", "main",
           "measure", "passes", "render", "search", "step_rates", "tighter", "window"]

BLOCK = "goodput"
DEFAULT_SETUPS = ("router-cache_aware", "sglang-cache_aware", "smg-cache_aware",
                  "vllm-cache_aware")


@dataclass(frozen=True)
class Step:
    """One run of one setup at one rate (requests/s for the whole fleet)."""

    rate: float
    ttft_p99: float | None  # seconds; None when no request succeeded
    errors: int  # failed or unsent requests
    requests: int
    ttft_p50: float | None = None
    hit_rate: float | None = None


# -- pure ------------------------------------------------------------------------------------------
def step_rates(start: float, growth: float, steps: int) -> list[float]:
    """``start, start*growth, ...``: ``steps`` rising rates."""
    if start <= 0 or growth <= 1 or steps < 1:
        raise ValueError(f"rates: expected start > 0, growth > 1, steps >= 1, got {start}, "
                         f"{growth}, {steps}")
    return [start * growth ** k for k in range(steps)]


def at_rate(requests: Sequence[Request], base_rate: float, rate: float) -> list[Request]:
    """The same requests with the arrival times of their schedule at ``rate`` instead of
    ``base_rate`` (times multiplied by ``base_rate / rate``; order and content unchanged)."""
    k = base_rate / rate
    return [replace(r, at=r.at * k) for r in requests]


def window(requests: Sequence[Request], duration: float) -> list[Request]:
    """The requests that arrive before ``duration`` seconds (arrival order)."""
    return [r for r in requests if r.at < duration]


def passes(step: Step, slo: float) -> bool:
    """Within the SLO: some requests, none failed or unsent, TTFT p99 <= ``slo`` seconds."""
    return (step.requests > 0 and step.errors == 0 and step.ttft_p99 is not None
            and step.ttft_p99 <= slo)


def search(run_step: Callable[[float], Step], rates: Sequence[float], slo: float) -> list[Step]:
    """Run ``rates`` in rising order until the first step that does not pass (included)."""
    out = []
    for rate in sorted(rates):
        step = run_step(rate)
        out.append(step)
        if not passes(step, slo):
            break
    return out


def goodput(steps: Sequence[Step], slo: float) -> float | None:
    """The highest rate of the passing steps before the first failing one (by rate), None when
    the lowest step already fails."""
    best = None
    for step in sorted(steps, key=lambda s: s.rate):
        if not passes(step, slo):
            break
        best = step.rate
    return best


# -- measuring -------------------------------------------------------------------------------------
def measure(workload: str, replicas: int, setups: Sequence[str], slo: float, start: float,
            growth: float, steps: int, workdir: Path, seed: int = 0,
            duration: float | None = None, log: Callable[[str], None] | None = None
            ) -> dict[str, Any]:
    """Every setup's `search` on the cell ``workload`` at ``replicas`` (rates per replica:
    ``start``, ``growth``; ``duration`` seconds of traffic per step, default the cell's own);
    JSON-shaped results."""
    from loadtest.cells import WORKLOADS, cell_requests
    from loadtest.compare import machine_info, run_setup
    from loadtest.fleet import FleetError
    from loadtest.runner import Plan
    from loadtest.setups import SetupError, parse_setup, tiny_tokenizer_dir

    say = log or (lambda m: print(m, file=sys.stderr, flush=True))
    cells = {w.name: w for w in WORKLOADS}
    if workload not in cells:
        raise ValueError(f"workload: expected one of {', '.join(cells)}, got {workload!r}")
    cell = cells[workload].at(replicas)
    rates = step_rates(start * replicas, growth, steps)
    seconds = duration if duration is not None else cell.requests / cell.rate
    # enough requests for the highest rate's window (10% spare for the Poisson spread)
    cell = replace(cell, requests=math.ceil(1.1 * seconds * max(cell.rate, rates[-1])) + 8)
    reqs, meta = cell_requests(cell, seed, workdir / "cell")
    tokenizer = tiny_tokenizer_dir(workdir / "tokenizer")
    out: dict[str, Any] = {
        "workload": meta, "replicas": replicas, "fleet": asdict(cell.fleet), "slo": slo,
        "rates": rates, "duration": seconds, "seed": seed, "machine": machine_info(),
        "setups": {}, "failed": {}}
    for name in setups:
        setup = parse_setup(name)
        reason = setup.unavailable()
        if reason:
            out["failed"][name] = reason
            say(f"goodput {name}: skipped ({reason})")
            continue

        def run_step(rate: float, setup: Any = setup, name: str = name) -> Step:
            sent = window(at_rate(reqs, cell.rate, rate), seconds)
            plan = Plan("http://unused", rate=rate, max_requests=len(sent),
                        max_time=max(60.0, 4 * seconds + 30.0))
            res, _ = run_setup(setup, sent, plan, cell.fleet,
                               workdir / f"{name}-{rate:.2f}", tokenizer, meta)
            s = res.summary()
            step = Step(rate, _finite(s["ttft"].get("p99")), int(s["error_count"]),
                        int(s["requests"]), _finite(s["ttft"].get("p50")),
                        _finite(s.get("hit_rate")))
            say(f"goodput {workload} x{replicas} {name} @ {rate / replicas:.2f}/s/replica: "
                f"ttft p99 {step.ttft_p99 if step.ttft_p99 is not None else 'n/a'} s, "
                f"errors {step.errors} -> {'pass' if passes(step, slo) else 'FAIL'}")
            return step

        try:
            done = search(run_step, rates, slo)
        except (SetupError, FleetError) as exc:
            out["failed"][name] = f"{type(exc).__name__}: {exc}"[:500]
            say(f"goodput {name}: failed ({exc})")
            continue
        best = goodput(done, slo)
        out["setups"][name] = {
            "goodput": best, "goodput_per_replica": best / replicas if best else None,
            "ceiling": len(done) == len(rates) and passes(done[-1], slo),
            "steps": [asdict(s) for s in done]}
    return out


def _per_replica(rate: float | None, replicas: int) -> str:
    return "none" if rate is None else f"{rate / replicas:.2f}"


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


# -- rendering -------------------------------------------------------------------------------------
def tighter(steps: Sequence[dict[str, Any]], slo: float) -> float | None:
    """`goodput` at an SLO no looser than the run's, from the run's steps (JSON): every step
    up to the first one that fails the tighter SLO was run, since it passed the run's."""
    return goodput([Step(**s) for s in steps], slo)


def render(results: Sequence[dict[str, Any]], command: str,
           extra_slos: Sequence[float] = ()) -> str:
    """The ``goodput`` block of docs/benchmarks.md: one table row per cell and setup; a column
    per SLO of ``extra_slos`` tighter than a cell's (`tighter`, from the same steps)."""
    lines = [f"<!-- {BLOCK}:begin -->", "## Goodput at a TTFT SLO", "",
             "The highest open-loop request rate at which a setup's TTFT p99 stays within the SLO "
             "with no failed request, per replica (`loadtest.goodput`: the same requests and "
             "arrival pattern at every rate and for every setup, a fresh fleet per step, a "
             "setup stops at its first failing step; `>=` marks a setup that passed the highest "
             "rate tried).", "", f"```\n{command}\n```", ""]
    for res in results:
        m = res.get("machine") or {}
        n = res["replicas"]
        rates = ", ".join(f"{r / n:.2f}" for r in res["rates"])
        extra = [x for x in extra_slos if x < res["slo"]]
        lines += [f"### {res['workload']['name']}, {res['replicas']} replicas, SLO "
                  f"{res['slo']:g} s", "",
                  f"{res['duration']:g} s of traffic per step, seed {res['seed']}, rates "
                  f"{rates} /s per replica; "
                  f"commit {m.get('commit', '?')}, {m.get('date', '')}, {m.get('nproc', '?')} "
                  "CPUs.", "",
                  "| setup | goodput (req/s per replica) | TTFT p99 ms at each rate | hit rate at "
                  "the goodput |" + "".join(f" at SLO {x:g} s |" for x in extra)
                  + "", "| --- | ---: | --- | ---: |" + " ---: |" * len(extra)]
        for name, s in res["setups"].items():
            steps = s["steps"]
            best = s["goodput_per_replica"]
            shown = "none" if best is None else (">= " if s["ceiling"] else "") + f"{best:.2f}"
            p99s = ", ".join("err" if st["errors"] else
                             ("-" if st["ttft_p99"] is None else f"{st['ttft_p99'] * 1000:.0f}")
                             for st in steps)
            at = next((st for st in steps if s["goodput"] is not None
                       and st["rate"] == s["goodput"]), None)
            hit = f"{at['hit_rate']:.1%}" if at and at.get("hit_rate") is not None else "-"
            cols = "".join(f" {_per_replica(tighter(steps, x), n)} |" for x in extra)
            lines.append(f"| {name} | {shown} | {p99s} | {hit} |{cols}")
        for name, why in res.get("failed", {}).items():
            lines.append(f"| {name} | not run: {why} | | |")
        lines.append("")
        if res.get("plot"):  # a path relative to the page, set by whoever drew it
            lines += [f"![TTFT p99 against the rate, {res['workload']['name']}, {n} replicas]"
                      f"({res['plot']})", ""]
    return "\n".join(lines).rstrip("\n") + f"\n<!-- {BLOCK}:end -->\n"


# -- CLI -------------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", action="append", default=None,
                   help="a make-bench cell workload (repeatable; default multi-turn)")
    p.add_argument("--replicas", action="append", type=int, default=None,
                   help="fleet size (repeatable; default 4)")
    p.add_argument("--setup", action="append", default=None,
                   help=f"repeatable; default: {', '.join(DEFAULT_SETUPS)}")
    p.add_argument("--slo", type=float, default=1.0, help="TTFT p99 bound, seconds")
    p.add_argument("--start-rate", type=float, default=2.5,
                   help="first step's rate, requests/s per replica")
    p.add_argument("--growth", type=float, default=1.25, help="rate factor between steps")
    p.add_argument("--steps", type=int, default=6, help="at most this many rates per setup")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds of traffic per step (default: the cell's requests / its rate)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="JSON results")
    p.add_argument("--markdown", help="write the markdown block here (default: stdout)")
    p.add_argument("--plot", help="PNG (one per cell: the workload and size are appended)")


def run_all(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """Every (workload, replicas) cell; with ``--out`` the JSON is rewritten after each cell,
    so an interrupted run keeps the cells it finished."""
    out = []
    for workload in args.workload or ["multi-turn"]:
        for replicas in args.replicas or [4]:
            out.append(measure(workload, replicas, args.setup or list(DEFAULT_SETUPS),
                               args.slo, args.start_rate, args.growth, args.steps,
                               workdir / f"{workload}-{replicas}", args.seed, args.duration))
            if args.out:
                Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return out


def write_plots(results: Sequence[dict[str, Any]], plot: str) -> list[Path]:
    from loadtest.plots import goodput_plot
    from loadtest.report import slug

    base = Path(plot)
    return [goodput_plot(res, base.with_name(
        f"{base.stem}-{slug(res['workload']['name'])}-{res['replicas']}{base.suffix or '.png'}"))
        for res in results]


def command_line(args: argparse.Namespace) -> str:
    parts = ["prefix-loadtest goodput"]
    for w in args.workload or ["multi-turn"]:
        parts.append(f"--workload {w}")
    for n in args.replicas or [4]:
        parts.append(f"--replicas {n}")
    for s in args.setup or DEFAULT_SETUPS:
        parts.append(f"--setup {s}")
    parts.append(f"--slo {args.slo:g} --start-rate {args.start_rate:g} --growth {args.growth:g} "
                 f"--steps {args.steps}" + (f" --duration {args.duration:g}" if args.duration
                                             else ""))
    return " ".join(parts)


def main(args: argparse.Namespace) -> int:
    try:
        step_rates(args.start_rate, args.growth, args.steps)
    except ValueError as exc:
        print(f"prefix-loadtest goodput: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="goodput-") as tmp:
        try:
            results = run_all(args, Path(tmp))
        except ValueError as exc:
            print(f"prefix-loadtest goodput: {exc}", file=sys.stderr)
            return 2
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    if args.plot:
        write_plots(results, args.plot)
    md = render(results, command_line(args))
    if args.markdown:
        Path(args.markdown).write_text(md)
    else:
        print(md)
    return 0
