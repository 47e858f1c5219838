"""`python -m loadtest.bench` (`make bench`): reproduce docs/benchmarks.md and its figures.

Three parts, run one after the other on this machine:

1. compare (`loadtest.compare`): the six workloads (`WORKLOADS`: shared-prefix, hot-prefix,
   multi-turn, a scaled-down mooncake replay, rag, agent) at each fleet size of `FLEETS`, through
   every routing setup (`setups`: the router with each of its policies, default first, nginx,
   and the peer routers of `PEERS`: sglang-router, smg and vllm-router cache_aware, vllm-router
   consistent_hash and power_of_two, sglang-router round_robin), a fresh simulated fleet per
   setup; on the `SPLIT_FLEETS` cells also the default policy as 1, 2 and 4 processes behind the
   round-robin splitter and sglang-router and vllm-router as 2 (`split_setups`). Each cell also gets its one-cache ceiling
   and its hit-rate bounds (`bounds`: any router's best hit rate at max/mean <= 1.3, which the
   targets table holds against sglang-router's);
2. overhead (`loadtest.overhead`): proxy CPU per request / per chunk and added latency, with the
   judged policies (`judged`: the default, and cache_aware while it is not the default);
3. simulate (`loadtest.simulate`): the discrete-event simulator at 64 replicas (`SIM_WORKLOADS`),
   every router policy, each against the ceiling;
4. goodput (`loadtest.goodput`): on the `GOODPUT_CELLS` the highest open-loop rate at which
   TTFT p99 stays within `GOODPUT_SLO`, for the default policy and the cache-aware peers
   (`GOODPUT_SETUPS`); its own block of the doc and ``docs/img/bench-goodput-*.png``.

A `BenchWorkload` is sized for 4 replicas; `BenchWorkload.at(n)` scales its rate and its request
count by n/4 on the same KV per replica, so every fleet size sees the same load per replica and
the same traffic time. The setups follow the router: a policy added to `router.settings.POLICIES`
is benchmarked, and the targets judge whichever is `routing.policy`'s default.

Writes ``docs/benchmarks.md`` (`loadtest.bench_doc`), ``docs/img/bench-*.png`` and the raw JSON
under ``build/bench/``. ``--quick`` shrinks every part (a smoke run of the pipeline, not a
benchmark); ``--skip`` leaves parts out; ``--workload`` / ``--replicas`` / ``--setup`` narrow the
compare part; ``--render-only`` redraws the doc and figures from the saved JSON. Budget: the full
run is sized to finish in about 30 minutes on 2 cores (8-10 s of traffic per setup and cell,
plus 2-5 s of start-up each; the 64-replica simulation 2-3k requests per workload).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from loadtest.cells import (
    BASE_REPLICAS,
    FLEETS,
    SIM_WORKLOADS,
    SPLIT_FLEETS,
    WORKLOADS,
    BenchWorkload,
    SimWorkload,
    cell_requests,
    mooncake_slice,
)
from loadtest.compare import compare, machine_info
from loadtest.report import slug
from loadtest.runner import Plan
from loadtest.setups import parse_setup

__all__ = ["BASE_REPLICAS", "FLEETS", "PEERS", "SIM_WORKLOADS", "SPLIT_FLEETS", "WORKLOADS",
           "BenchWorkload",
           "SimWorkload", "default_policy", "judged", "main", "mooncake_slice", "setups",
           "split_setups"]

ROOT = Path(__file__).resolve().parents[1]


def default_policy() -> str:
    """The router's default ``routing.policy`` (what its settings parser falls back to)."""
    from router.settings import RoutingSettings

    return RoutingSettings.policy


def policies() -> list[str]:
    """Every policy the router accepts, its default first."""
    from router.settings import POLICIES

    default = default_policy()
    return [default] + [p for p in POLICIES if p != default]


def judged() -> list[str]:
    """The router setups the targets are rendered for: the default policy, and cache_aware
    (issue #18's candidate for the default) while it is not the default yet."""
    out = [f"router-{default_policy()}"]
    if "cache_aware" in policies() and default_policy() != "cache_aware":
        out.append("router-cache_aware")
    return out


# the peer routers of every cell (the `[compare]` extra's pinned versions): their cache-aware
# policies, vllm-router's consistent_hash and power_of_two, and a round-robin baseline
PEERS = ("sglang-cache_aware", "smg-cache_aware", "vllm-cache_aware", "vllm-consistent_hash",
         "vllm-power_of_two", "sglang-round_robin")


# goodput (part 4): (workload, replicas) cells, the setups, the SLO and the rate ladder per
# replica (start, growth, steps: 2.5 .. 26.5 requests/s per replica; the compare cells run 5)
GOODPUT_CELLS = (("multi-turn", 4), ("shared-prefix", 4), ("rag", 4))
GOODPUT_SETUPS = ("sglang-cache_aware", "smg-cache_aware", "vllm-cache_aware")
GOODPUT_SLO = 1.0
GOODPUT_TIGHTER = (0.5,)  # also shown, from the same steps (`loadtest.goodput.tighter`)
GOODPUT_LADDER = (2.5, 1.3, 10)


def setups() -> list[str]:
    """The compare setups of every cell."""
    return [f"router-{p}" for p in policies()] + ["nginx", *PEERS]


def split_setups() -> list[str]:
    """Several router processes: the cache-aware policy (else the default) as 1, 2 and 4
    processes behind the splitter, and sglang-router and vllm-router cache_aware as 2."""
    ca = "cache_aware" if "cache_aware" in policies() else default_policy()
    return [f"router-{ca}-x1", f"router-{ca}-x2", f"router-{ca}-x4", "sglang-cache_aware-x2",
            "vllm-cache_aware-x2"]


def run_compare(cells: tuple[BenchWorkload, ...], names: list[str], split: list[str],
                workdir: Path, seed: int,
                split_fleets: tuple[int, ...] = SPLIT_FLEETS) -> dict[str, Any]:
    """Every cell through ``names`` (and ``split`` on the ``split_fleets`` cells)."""
    merged: dict[str, Any] = {}
    for w in cells:
        reqs, meta = cell_requests(w, seed, workdir / slug(w.key))
        plan = Plan("http://unused", rate=w.rate, max_requests=len(reqs), max_time=90.0)
        chosen = names + (split if w.fleet.replicas in split_fleets else [])
        res = compare({w.key: (reqs, meta)}, [parse_setup(s) for s in chosen], plan, w.fleet,
                      workdir / slug(w.key))
        block = res["workloads"][w.key]
        block["fleet"] = asdict(w.fleet)
        block["bounds"] = bounds(reqs, w)
        if not merged:
            merged = res
            merged.pop("fleet", None)  # per cell
        else:
            merged["workloads"][w.key] = block
    merged["ours"] = f"router-{default_policy()}"
    merged["judged"] = judged()
    return merged


def bounds(reqs: list[Any], w: BenchWorkload) -> dict[str, Any]:
    """The cell's hit-rate bounds (`loadtest.balance_bound.cell_bounds`: the LRU ceiling, any
    router's hit bound without and with max/mean <= `loadtest.targets.MAX_LOAD`, Belady's OPT
    over the fleet's capacity) from the requests alone; the targets table reads ``at_target``."""
    from loadtest.balance_bound import cell_bounds
    from loadtest.ceiling import request_prompts
    from loadtest.targets import MAX_LOAD

    f = w.fleet
    return cell_bounds(request_prompts(reqs, f.block_size, f.kv_blocks), f.replicas,
                       f.kv_blocks, f.block_size, MAX_LOAD, len(reqs))


def run_overhead(workdir: Path, quick: bool) -> dict[str, Any]:
    from loadtest.overhead import DEFAULT_SETUPS as OH_SETUPS
    from loadtest.overhead import OverheadConfig, measure

    cfg = OverheadConfig()
    if quick:
        cfg = replace(cfg, latency_requests=30, cpu_requests=60, rounds=1, capacity_requests=60)
    # the judged policies in place of the router's row; the ratios use the first router row,
    # the candidate's when there is one
    names: list[str] = []
    for s in OH_SETUPS:
        names += list(reversed(judged())) if s.startswith("router-") else [s]
    return measure([parse_setup(s) for s in names], cfg, workdir,
                   log=lambda m: print(m, file=sys.stderr, flush=True))


def _sim_requests(w: SimWorkload) -> list[Any]:
    from loadtest.simulate import workload_requests

    return workload_requests(w.name, w.requests, 0, w.rate, **w.spec)


def run_goodput(workdir: Path, quick: bool) -> list[dict[str, Any]]:
    """`loadtest.goodput.measure` on every `GOODPUT_CELLS` cell (``quick``: the first cell, two
    rates, 1 s of traffic a step)."""
    from loadtest.goodput import measure

    start, growth, steps = GOODPUT_LADDER
    cells = GOODPUT_CELLS[:1] if quick else GOODPUT_CELLS
    names = [f"router-{default_policy()}", *GOODPUT_SETUPS]
    return [measure(w, n, names, GOODPUT_SLO, start, growth, 2 if quick else steps,
                    workdir / f"{w}-{n}", duration=1.0 if quick else None)
            for w, n in cells]


def goodput_command() -> str:
    start, growth, steps = GOODPUT_LADDER
    cells = " ".join(f"--workload {w}" for w in dict.fromkeys(w for w, _ in GOODPUT_CELLS))
    sizes = " ".join(f"--replicas {n}" for n in dict.fromkeys(n for _, n in GOODPUT_CELLS))
    names = " ".join(f"--setup {s}" for s in [f"router-{default_policy()}", *GOODPUT_SETUPS])
    return (f"prefix-loadtest goodput {cells} {sizes} {names} --slo {GOODPUT_SLO:g} "
            f"--start-rate {start:g} --growth {growth:g} --steps {steps}   # make bench, part 4")


def run_simulate(quick: bool) -> dict[str, Any]:
    """Every router policy on every `SIM_WORKLOADS` entry; a policy the simulation cannot run
    is reported as failed, the others go on."""
    from loadtest.simulate import SimConfig, simulate

    parts = []
    for w in SIM_WORKLOADS:
        if quick:  # a quarter of the fleet at a quarter of the rate, a tenth of the requests
            w = replace(w, requests=w.requests // 10, rate=w.rate / 4, replicas=w.replicas // 4)
        reqs = _sim_requests(w)
        part: dict[str, Any] = {
            "workload": {"name": w.name, "requests": w.requests, "rate": w.rate,
                         "replicas": w.replicas,
                         "kv_blocks": w.kv_blocks, **w.spec},
            "results": [], "failed": {}}
        for policy in policies():
            try:
                res = simulate(reqs, SimConfig(replicas=w.replicas, policy=policy,
                                               kv_blocks=w.kv_blocks, max_num_seqs=64))
            except Exception as exc:  # one policy the simulator cannot run must not stop the rest
                part["failed"][policy] = f"{type(exc).__name__}: {exc}"[:300]
                traceback.print_exc()
                continue
            part["results"].append(res.to_json())
            print(f"simulate {w.name} {policy}: hit {res.hit_rate:.3f} "
                  f"({res.of_ceiling:.2f} of the ceiling) ttft p99 {res.ttft['p99']:.3f} "
                  f"max/mean {res.load_max_over_mean:.2f} ({res.wall_seconds:.0f}s)",
                  file=sys.stderr, flush=True)
        parts.append(part)
    return {"workloads": parts}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of the pipeline")
    p.add_argument("--skip", action="append", default=[],
                   choices=["compare", "overhead", "simulate", "goodput"])
    p.add_argument("--setup", action="append", default=None,
                   help="compare setups of every cell (repeatable; default: `setups()`)")
    p.add_argument("--split-setup", action="append", default=None,
                   help="setups of the SPLIT_FLEETS cells only (default: `split_setups()`; "
                        "'none' for none)")
    p.add_argument("--workload", action="append", default=None, help="compare workloads")
    p.add_argument("--replicas", action="append", type=int, default=None,
                   help=f"fleet sizes (repeatable; default: {', '.join(map(str, FLEETS))})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    p.add_argument("--img", default=str(ROOT / "docs" / "img"))
    p.add_argument("--json-dir", default=str(ROOT / "build" / "bench"))
    p.add_argument("--render-only", action="store_true",
                   help="redraw the doc and figures from JSON_DIR/bench.json, run nothing")
    args = p.parse_args(argv)

    from loadtest.bench_doc import benchmarks_markdown

    t0 = time.monotonic()
    img, json_dir = Path(args.img), Path(args.json_dir)
    if args.render_only:
        saved = json.loads((json_dir / "bench.json").read_text())
        _write_doc(Path(args.doc), benchmarks_markdown(saved, _figures(saved, img),
                                                       Path(args.doc).parent), saved)
        return 0
    json_dir.mkdir(parents=True, exist_ok=True)
    chosen = tuple(w for w in WORKLOADS if not args.workload or w.name in args.workload)
    fleets = tuple(args.replicas or ((BASE_REPLICAS,) if args.quick else FLEETS))
    cells = tuple(w.at(n) for w in chosen for n in fleets)
    if args.quick:
        cells = tuple(replace(w, requests=20) for w in cells)
    split = [] if args.split_setup == ["none"] else (args.split_setup or split_setups())
    data: dict[str, Any] = {"machine": machine_info(), "quick": args.quick, "timings": {}}
    parts = {
        "compare": lambda work: run_compare(cells, args.setup or setups(), split,
                                            work / "compare", args.seed,
                                            fleets if args.quick else SPLIT_FLEETS),
        "overhead": lambda work: run_overhead(work / "overhead", args.quick),
        "simulate": lambda work: run_simulate(args.quick),
        "goodput": lambda work: run_goodput(work / "goodput", args.quick),
    }
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for name, part in parts.items():
            if name in args.skip:
                continue
            t = time.monotonic()
            try:
                data[name] = part(Path(tmp))
            except Exception as exc:  # one broken part must not lose the others' minutes
                data.setdefault("failed", {})[name] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            data["timings"][name] = time.monotonic() - t
            (json_dir / "bench.json").write_text(json.dumps(data, indent=1) + "\n")
    data["timings"]["total"] = time.monotonic() - t0
    (json_dir / "bench.json").write_text(json.dumps(data, indent=1) + "\n")
    figures = _figures(data, img)
    _write_doc(Path(args.doc), benchmarks_markdown(data, figures, Path(args.doc).parent), data)
    print(f"wrote {args.doc} and {len(figures)} figures in {data['timings']['total']:.0f}s",
          file=sys.stderr)
    return 0


def _write_doc(doc: Path, text: str, data: dict[str, Any] | None = None) -> None:
    """Write the regenerated doc, keeping the sections other scripts own
    (:mod:`loadtest.doc_blocks`: `loadtest.bench_tracing`'s, `scripts/bench_block_keys.py`'s),
    with the goodput block of this run (``data["goodput"]``) in place of the old one."""
    from loadtest.doc_blocks import keep_blocks, replace_block
    from loadtest.goodput import BLOCK, render

    text = keep_blocks(doc.read_text() if doc.exists() else "", text)
    if data and data.get("goodput"):
        text = replace_block(text, BLOCK, render(data["goodput"], goodput_command(),
                                                 GOODPUT_TIGHTER))
    doc.write_text(text)


def _figures(data: dict[str, Any], img: Path) -> dict[str, Path]:
    from loadtest.plots import compare_plots, simulate_plot

    out: dict[str, Path] = {}
    if "compare" in data:
        keys = {slug(k): k for k in data["compare"].get("workloads", {})}
        for path in compare_plots(data["compare"], img, prefix="bench-compare"):
            stem = path.stem.removeprefix("bench-compare-")
            out[keys.get(stem, stem)] = path
    if data.get("goodput"):
        from loadtest.goodput import write_plots

        for res, path in zip(data["goodput"], write_plots(data["goodput"],
                                                          str(img / "bench-goodput.png")),
                             strict=True):
            res["plot"] = f"img/{path.name}"
            out[f"goodput-{path.stem}"] = path
    sim = data.get("simulate") or {}
    for part in sim.get("workloads", []):
        w = part["workload"]
        if part.get("results"):
            out[f"simulate-{w['name']}"] = simulate_plot(
                part["results"], img / f"bench-simulate-{slug(w['name'])}.png",
                f"simulate: {w['replicas']} replicas, {w['name']}, {w['requests']} requests")
    return out


if __name__ == "__main__":
    sys.exit(main())
