"""`python -m loadtest.bench` (`make bench`): reproduce docs/benchmarks.md and its figures.

Three parts, run one after the other on this machine:

1. compare (`loadtest.compare`): shared-prefix, hot-prefix, multi-turn and a scaled-down
   mooncake replay through every routing setup, 4 simulated replicas restarted cold per setup;
2. overhead (`loadtest.overhead`): proxy CPU per request / per chunk and added latency;
3. simulate (`loadtest.simulate`): the discrete-event simulator at 64 replicas.

Writes ``docs/benchmarks.md``, ``docs/img/bench-*.png`` and the raw JSON under
``build/bench/``. ``--quick`` shrinks every part (a smoke run of the pipeline, not a benchmark);
``--skip`` leaves parts out; ``--render-only`` redraws the doc and figures from the saved JSON. Budget: the full run is sized to finish in well under 15 minutes on
2 cores (about 8 s of traffic per setup and workload, plus start-up).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from loadtest.compare import DEFAULT_SETUPS, FleetParams, compare, machine_info
from loadtest.runner import DEFAULT_TRACE, Plan
from loadtest.setups import parse_setup
from loadtest.workloads import Request, WorkloadSpec, generate

__all__ = ["BenchWorkload", "WORKLOADS", "main"]

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class BenchWorkload:
    name: str
    requests: int
    rate: float
    fleet: FleetParams
    spec: dict[str, Any]
    max_input_tokens: int | None = None  # mooncake: see `mooncake_slice`


WORKLOADS = (
    BenchWorkload("shared-prefix", 120, 12.0, FleetParams(), {}),
    BenchWorkload("hot-prefix", 120, 12.0, FleetParams(), {"turns": 4}),
    BenchWorkload("multi-turn", 120, 12.0, FleetParams(), {"turns": 4}),
    BenchWorkload("mooncake", 100, 8.0, FleetParams(kv_blocks=2048, speed=2.0),
                  {"trace_path": DEFAULT_TRACE, "max_output_tokens": 32},
                  max_input_tokens=9000),
)


def mooncake_slice(trace: Path, out: Path, requests: int, max_input_tokens: int) -> Path:
    """A scaled-down replay that keeps the trace's sharing: whole conversations.

    A conversation is the requests sharing their second block id (the first is the system
    prompt every record starts with). Conversations with >= 2 turns are taken in order of first
    appearance, with every turn of at most ``max_input_tokens``, until ``requests`` records;
    records keep their trace order and timestamps (the runner rescales time to the bench rate).
    Taking the first N records instead would keep almost no follow-up turns.
    """
    recs = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines() if line]
    conversations: dict[int, list[int]] = {}
    for i, r in enumerate(recs):
        if len(r["hash_ids"]) > 1 and r["input_length"] <= max_input_tokens:
            conversations.setdefault(r["hash_ids"][1], []).append(i)
    chosen: list[int] = []
    for turns in sorted((v for v in conversations.values() if len(v) >= 2), key=lambda v: v[0]):
        if len(chosen) + len(turns) <= requests:
            chosen += turns
        if len(chosen) >= requests - 1:
            break
    out.write_text("".join(json.dumps(recs[i]) + "\n" for i in sorted(chosen)))
    return out


def _requests(w: BenchWorkload, seed: int, workdir: Path) -> tuple[list[Request], dict[str, Any]]:
    spec = dict(w.spec)
    meta: dict[str, Any] = {"name": w.name, "rate": w.rate, "seed": seed}
    if w.max_input_tokens:
        workdir.mkdir(parents=True, exist_ok=True)
        spec["trace_path"] = str(mooncake_slice(Path(spec["trace_path"]), workdir / "slice.jsonl",
                                                w.requests, w.max_input_tokens))
        meta["slice"] = (f"whole conversations (>= 2 turns, <= {w.max_input_tokens} input "
                         "tokens per turn) in order of first appearance")
    reqs = generate(WorkloadSpec(w.name, requests=w.requests, rate=w.rate, seed=seed, **spec))
    meta["requests"] = len(reqs)
    meta.update({k: v for k, v in w.spec.items() if k != "trace_path"})
    return reqs, meta


def run_compare(workloads: tuple[BenchWorkload, ...], setups: list[str], workdir: Path,
                seed: int) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for w in workloads:
        reqs, meta = _requests(w, seed, workdir / w.name)
        plan = Plan("http://unused", rate=w.rate, max_requests=len(reqs), max_time=60.0)
        res = compare({w.name: (reqs, meta)}, [parse_setup(s) for s in setups], plan, w.fleet,
                      workdir / w.name)
        block = res["workloads"][w.name]
        block["fleet"] = asdict(w.fleet)
        if not merged:
            merged = res
        else:
            merged["workloads"][w.name] = block
    return merged


def run_overhead(workdir: Path, quick: bool) -> dict[str, Any]:
    from loadtest.overhead import DEFAULT_SETUPS as OH_SETUPS
    from loadtest.overhead import OverheadConfig, measure

    cfg = OverheadConfig()
    if quick:
        cfg = replace(cfg, latency_requests=30, cpu_requests=60, rounds=1, capacity_requests=60)
    return measure([parse_setup(s) for s in OH_SETUPS], cfg, workdir,
                   log=lambda m: print(m, file=sys.stderr, flush=True))


def run_simulate(quick: bool) -> dict[str, Any]:
    from loadtest.simulate import SimConfig, simulate, workload_requests

    n, replicas, prompts, rate = (400, 16, 32, 60.0) if quick else (4000, 64, 256, 240.0)
    reqs = workload_requests("shared-prefix", n, 0, rate, prompts=prompts)
    results = []
    for policy in ("prefix", "round_robin", "least_loaded"):
        res = simulate(reqs, SimConfig(replicas=replicas, policy=policy, kv_blocks=768,
                                       max_num_seqs=64))
        results.append(res.to_json())
        print(f"simulate {policy}: hit {res.hit_rate:.3f} ttft p99 {res.ttft['p99']:.3f} "
              f"({res.wall_seconds:.0f}s)", file=sys.stderr, flush=True)
    return {"workload": {"name": "shared-prefix", "requests": n, "prompts": prompts,
                         "rate": rate, "replicas": replicas, "kv_blocks": 768},
            "results": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of the pipeline")
    p.add_argument("--skip", action="append", default=[], choices=["compare", "overhead", "simulate"])
    p.add_argument("--setup", action="append", default=None, help="compare setups (repeatable)")
    p.add_argument("--workload", action="append", default=None, help="compare workloads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    p.add_argument("--img", default=str(ROOT / "docs" / "img"))
    p.add_argument("--json-dir", default=str(ROOT / "build" / "bench"))
    p.add_argument("--render-only", action="store_true",
                   help="redraw the doc and figures from JSON_DIR/bench.json, run nothing")
    args = p.parse_args(argv)

    from loadtest.report import benchmarks_markdown

    t0 = time.monotonic()
    img, json_dir = Path(args.img), Path(args.json_dir)
    if args.render_only:
        saved = json.loads((json_dir / "bench.json").read_text())
        _write_doc(Path(args.doc), benchmarks_markdown(saved, _figures(saved, img),
                                                       Path(args.doc).parent))
        return 0
    json_dir.mkdir(parents=True, exist_ok=True)
    workloads = tuple(w for w in WORKLOADS if not args.workload or w.name in args.workload)
    if args.quick:
        workloads = tuple(replace(w, requests=20) for w in workloads)
    data: dict[str, Any] = {"machine": machine_info(), "quick": args.quick, "timings": {}}
    parts = {
        "compare": lambda work: run_compare(workloads, args.setup or list(DEFAULT_SETUPS),
                                            work / "compare", args.seed),
        "overhead": lambda work: run_overhead(work / "overhead", args.quick),
        "simulate": lambda work: run_simulate(args.quick),
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
    _write_doc(Path(args.doc), benchmarks_markdown(data, figures, Path(args.doc).parent))
    print(f"wrote {args.doc} and {len(figures)} figures in {data['timings']['total']:.0f}s",
          file=sys.stderr)
    return 0


def _write_doc(doc: Path, text: str) -> None:
    """Write the regenerated doc, keeping the section `loadtest.bench_tracing` owns."""
    from loadtest.bench_tracing import keep_block

    doc.write_text(keep_block(doc.read_text() if doc.exists() else "", text))


def _figures(data: dict[str, Any], img: Path) -> dict[str, Path]:
    from loadtest.plots import compare_plots, simulate_plot

    out: dict[str, Path] = {}
    if "compare" in data:
        for path in compare_plots(data["compare"], img, prefix="bench-compare"):
            out[path.stem.removeprefix("bench-compare-")] = path
    if "simulate" in data:
        w = data["simulate"]["workload"]
        out["simulate"] = simulate_plot(
            data["simulate"]["results"], img / "bench-simulate.png",
            f"simulate: {w['replicas']} replicas, shared-prefix with {w['prompts']} prompts, "
            f"{w['requests']} requests")
    return out


if __name__ == "__main__":
    sys.exit(main())
