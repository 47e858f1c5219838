"""`python -m loadtest.bench_tracing` (`make bench-tracing`): what OpenTelemetry tracing costs the
router per request, side by side in one run; writes the "Tracing overhead" section of
docs/benchmarks.md.

Setups, all in front of one simulated ``--instant`` replica (`loadtest.overhead.measure`, the
same cells as `prefix-loadtest overhead` without the paced and capacity ones): ``direct``,
``router-prefix`` (tracing off), ``router-prefix+tracing`` (tracing on: the SDK's
BatchSpanProcessor and OTLP/HTTP exporter sending to `loadtest.otlp_sink`, a separate process
that drops what it gets) and, per ``--base REV`` (repeatable), ``router-prefix@REV``: the router
of another commit (``git archive REV`` unpacked into a temporary directory) with tracing off,
which is how "tracing off costs nothing" is checked against the code without tracing (the
commit before it, and main as merged, which has everyone else's changes too).

The whole measurement is repeated ``--repeats`` times (every setup restarted each time); each
repeat interleaves its cells over ``--rounds`` rounds. Reported per setup and mode: router CPU
per request at concurrency ``--concurrency`` (the proxy process tree's on-CPU time over
requests, export thread included) as the median over repeats, and each variant's difference to
``router-prefix`` per repeat (median, min, max): a difference whose min..max range spans zero
is not measurable in this run.

The section sits between ``<!-- tracing-overhead:begin -->`` and ``<!-- tracing-overhead:end
-->``; `loadtest.bench` (``make bench``) rewrites the rest of the file and keeps this block.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

from loadtest.overhead import OverheadConfig, measure
from loadtest.setups import Setup

__all__ = ["BEGIN", "END", "keep_block", "main", "render", "replace_block", "run"]

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- tracing-overhead:begin -->"
END = "<!-- tracing-overhead:end -->"
MODES = ("plain", "stream")


def _unpack(rev: str, into: Path) -> Path:
    """``git archive rev`` of this repository, unpacked into ``into/<short rev>``."""
    short = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                           capture_output=True, text=True).stdout.strip()
    tree = into / short
    tree.mkdir(parents=True)
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def run(cfg: OverheadConfig, repeats: int, bases: Sequence[str], workdir: Path,
        log: Any = None) -> dict[str, Any]:
    setups = [Setup("direct"), Setup("router", "prefix"), Setup("router", "prefix", tracing=True)]
    setups += [Setup("router", "prefix", source=str(_unpack(rev, workdir / "base")))
               for rev in bases]
    cpu: dict[str, dict[str, list[float]]] = {s.name: {m: [] for m in MODES} for s in setups}
    p50: dict[str, dict[str, list[float]]] = {s.name: {m: [] for m in MODES} for s in setups}
    errors: dict[str, int] = {s.name: 0 for s in setups}
    skipped: dict[str, str] = {}
    for r in range(repeats):
        res = measure(setups, cfg, workdir / f"repeat-{r}", log=log)
        skipped.update(res["skipped"])
        for row in res["rows"]:
            errors[row["setup"]] += row["errors"]
            if row["concurrency"] == cfg.concurrency and row["cpu_per_request"]:
                cpu[row["setup"]][row["mode"]].append(row["cpu_per_request"] * 1e6)
            if row["concurrency"] == 1:
                p50[row["setup"]][row["mode"]].append(row["latency"]["p50"] * 1e3)
        if log:
            log(f"bench-tracing: repeat {r + 1}/{repeats} done")
    return {"config": {**cfg.__dict__, "repeats": repeats, "bases": list(bases)},
            "setups": [s.name for s in setups], "cpu_us": cpu, "p50_ms": p50,
            "errors": errors, "skipped": skipped}


def _deltas(values: Sequence[float], ref: Sequence[float]) -> list[float]:
    return [v - r for v, r in zip(values, ref, strict=False)]


def render(data: Mapping[str, Any], machine: Mapping[str, Any]) -> str:
    """The markdown section (markers included) for one `run` result. Pure."""
    cfg = data["config"]
    ref = "router-prefix"
    based = [n for n in data["setups"] if "@" in n]
    lines = [BEGIN, "## Tracing overhead", "",
             f"`python -m loadtest.bench_tracing` (`make bench-tracing`) on {machine.get('date')}, "
             f"commit {machine.get('commit')}, {machine.get('nproc')} cores ({machine.get('cpu')}). "
             f"One `--instant` simulated replica, the fixed chat request of the proxy-overhead "
             f"runs ({cfg['chunks']} chunks when streamed); CPU = on-CPU time of the router's "
             f"process (export thread included) per request at concurrency "
             f"{cfg['concurrency']}, {cfg['cpu_requests']} requests per cell and repeat; "
             f"{cfg['repeats']} repeats (every setup restarted), each interleaving the setups "
             f"over {cfg['rounds']} rounds. `+tracing`: tracing on, every request sampled, the "
             f"SDK's batch span processor and OTLP/HTTP exporter to a local sink "
             f"(`loadtest.otlp_sink`, its own process). "
             + (f"{', '.join(f'`{n}`' for n in based)}: the router of that commit (without "
                f"tracing) in the same environment. " if based else "")
             + "Δ = the setup minus `router-prefix` (tracing off) in the same repeat: median, "
               "and min..max over the repeats.", "",
             "| setup | mode | CPU µs/request (median) | Δ µs/request | Δ min..max | "
             "p50 ms, concurrency 1 | errors |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for name in data["setups"]:
        for mode in MODES:
            vals = data["cpu_us"][name][mode]
            if not vals:
                continue
            p50 = data["p50_ms"][name][mode]
            if name == ref or name == "direct":
                delta, spread = "–", "–"
            else:
                d = _deltas(vals, data["cpu_us"][ref][mode])
                delta = f"{statistics.median(d):+.0f}"
                spread = f"{min(d):+.0f}..{max(d):+.0f}"
            lines.append(f"| {name} | {mode} | {statistics.median(vals):.0f} | {delta} | "
                         f"{spread} | {statistics.median(p50):.2f} | {data['errors'][name]} |")
    lines += ["", *_verdicts(data), END]
    return "\n".join(lines) + "\n"


def _verdicts(data: Mapping[str, Any]) -> list[str]:
    out = []
    ref = data["cpu_us"]["router-prefix"]
    for name in data["setups"]:
        if "@" not in name and "+tracing" not in name:
            continue
        for mode in MODES:
            d = _deltas(data["cpu_us"][name][mode], ref[mode])
            if not d:
                continue
            what = (f"tracing off against {name.split('@')[1]}"
                    if "@" in name else "tracing on (batch exporter)")
            if "@" in name:
                d = [-x for x in d]  # this tree minus the old one
            span = f"median {statistics.median(d):+.0f} µs, range {min(d):+.0f}..{max(d):+.0f}"
            verdict = ("within the run's noise (the range spans 0)" if min(d) <= 0 <= max(d)
                       else "measurable")
            out.append(f"- {what}, {mode}: {span} per request — {verdict}.")
    return out


def replace_block(doc: str, block: str) -> str:
    """``doc`` with its tracing block replaced by ``block`` (appended when it has none)."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start >= 0 and end > start:
        return doc[:start] + block + doc[end + len(END):].lstrip("\n")
    return doc.rstrip("\n") + "\n\n" + block


def keep_block(old: str, new: str) -> str:
    """What `loadtest.bench` writes: its freshly rendered ``new`` plus the tracing block of
    the ``old`` file, if that had one."""
    start, end = old.find(BEGIN), old.find(END)
    if start < 0 or end < start or BEGIN in new:
        return new
    return replace_block(new, old[start:end + len(END)] + "\n")


def main(argv: list[str] | None = None) -> int:
    from loadtest.compare import machine_info

    p = argparse.ArgumentParser(prog="python -m loadtest.bench_tracing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    c = OverheadConfig()
    p.add_argument("--base", action="append", default=[],
                   help="also run this commit's router (git rev), tracing off; repeatable")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=c.concurrency)
    p.add_argument("--cpu-requests", type=int, default=c.cpu_requests)
    p.add_argument("--latency-requests", type=int, default=200)
    p.add_argument("--doc", default=str(ROOT / "docs" / "benchmarks.md"))
    p.add_argument("--out", help="raw results (JSON)")
    p.add_argument("--workdir", help="keep the setups' logs and configs here (default: a temp dir)")
    args = p.parse_args(argv)
    cfg = OverheadConfig(concurrency=args.concurrency, cpu_requests=args.cpu_requests,
                         latency_requests=args.latency_requests, rounds=args.rounds,
                         paced_ms=0.0, capacity_requests=0)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp:
        data = run(cfg, args.repeats, args.base, Path(args.workdir or tmp),
                   log=lambda m: print(m, file=sys.stderr, flush=True))
    data["seconds"] = time.monotonic() - t0
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    block = render(data, machine_info())
    doc = Path(args.doc)
    doc.write_text(replace_block(doc.read_text() if doc.exists() else "", block))
    print(block)
    print(f"wrote the tracing section of {doc} in {data['seconds']:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
