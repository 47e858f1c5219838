"""`prefix-loadtest overhead`: what a proxy costs per request, measured side by side in one run.

Fleet: simulated replicas in ``--instant`` mode (no timing model: a reply is as fast as the
replica's Python can produce it), so what differs between setups is the proxy. One fixed chat
body with a ~1.5k-character system prompt; non-streamed answers carry 16 tokens, streamed ones
``--chunks`` (64) content chunks.

All setups (``direct`` = no proxy, ``passthrough`` = uvicorn + aiohttp with no routing - the
floor of the router's stack -, the router, nginx, sglang-router) run at once in front of one
fleet, and the measurements are interleaved in rounds (every setup's cell, then the next
round), so slow drift in the shared machine's load falls on every setup alike. Per setup and mode
(non-streamed, streamed) two closed-loop cells:

* concurrency 1 (``--latency-requests``): client-side E2E p50/p99; *added p50* = the setup's p50
  minus direct's p50 in the same mode (same run, same machine, minutes apart);
* concurrency ``--concurrency`` (``--cpu-requests``): proxy CPU = on-CPU time of the proxy's
  process tree (`loadtest.setups.cpu_seconds`, nginx workers included) after minus before, divided by
  requests (CPU/request) and, streamed, by relayed content chunks (CPU/chunk = CPU per streamed
  request / chunks per request; an upper bound on the marginal per-chunk cost). For ``direct``
  the process is the replica itself.

* token-paced streams (mode ``paced``, ``--paced-ms``, default 2 ms): a second fleet whose
  engine gives every running stream one token per 2 ms (no prefill or per-sequence cost), so
  each chunk reaches the proxy on its own, as a real vLLM stream does; concurrency
  ``--concurrency``, ``--paced-requests`` streams per setup. This is the CPU-per-chunk cell the
  targets use: instant streams arrive in bursts (the instant replica writes a whole stream at
  once), where the per-request cost dominates the per-chunk figure.

* capacity (``--capacity-requests``, ``direct`` and the router only): the same bodies from a
  closed loop at concurrency ``--concurrency`` whose client only reads each body to its end
  (no SSE parsing), so the server is as busy as this machine lets it be. The cells above are
  paced by the load client's own work (it decodes every SSE event: ~400 streams/s), and a
  server that answers one request per wake-up pays its event-loop round trip on each: an instant
  replica's 64-chunk stream costs ~330 us of CPU there against ~210 us when requests queue up.
  A server's capacity is what it sustains when busy, so one instant replica's capacity as a
  multiple of the router's (issue #3: at least 3x) is router CPU/request over the replica's in
  these cells (``replica_capacity_vs_router_*``; from the concurrency cells when they are
  skipped).

Ratios against sglang-router are computed from the same run (`ratios`). CPU time is read to the
nanosecond (schedstat), but one reading carries scheduler noise, so the CPU runs are sized to use
at least a few seconds of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from loadtest.fleet import Fleet
from loadtest.runner import Plan, run
from loadtest.setups import Launched, Setup, SetupError, cpu_seconds, launch, parse_setup
from loadtest.stats import summarize
from loadtest.workloads import CHAT, Request, synthetic_text

__all__ = ["DEFAULT_SETUPS", "OverheadConfig", "add_arguments", "closed_loop", "main", "measure",
           "ratios"]

T = TypeVar("T")

DEFAULT_SETUPS = ("direct", "passthrough", "router-prefix", "nginx", "sglang-cache_aware",
                  "smg-cache_aware", "vllm-cache_aware")


@dataclass(frozen=True)
class OverheadConfig:
    replicas: int = 1
    concurrency: int = 16
    latency_requests: int = 300
    cpu_requests: int = 1500
    chunks: int = 64
    rounds: int = 3
    max_time: float = 120.0
    # token-paced streams (the CPU-per-chunk method): a second fleet whose engine
    # emits one token per `paced_ms` to every running stream; 0 = skip
    paced_ms: float = 2.0
    paced_requests: int = 480
    # capacity cells (direct and the router, client reads bodies only); 0 = skip
    capacity_requests: int = 3000


def chat_body(stream: bool, max_tokens: int) -> dict[str, Any]:
    """The one request body of the overhead runs (also `scripts/bench_replica.py --workload
    fixed`): a ~1.5k-character system prompt and a short user turn."""
    import random

    system = "You are the ACME help desk assistant.\n" + synthetic_text(random.Random(7), 260)
    return {"model": "sim-model", "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "How do I reset my password?"}]}


def _requests(n: int, stream: bool, max_tokens: int) -> list[Request]:
    body = chat_body(stream, max_tokens)
    return [Request(i, 0.0, CHAT, body, group="fixed") for i in range(n)]


@dataclass
class _Acc:
    """Samples of one (setup, mode, concurrency) cell, gathered over the rounds."""

    e2e: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    ok: int = 0
    errors: int = 0
    tokens: int = 0
    cpu: float | None = 0.0
    wall: float = 0.0

    @property
    def cpu_per_request(self) -> float | None:
        return self.cpu / self.ok if self.cpu is not None and self.ok else None

    @property
    def throughput(self) -> float | None:
        return self.ok / self.wall if self.wall else None


def _round(launched: Launched, setup: Setup, mode: str, concurrency: int, n: int,
           cfg: OverheadConfig, acc: _Acc) -> None:
    stream = mode != "plain"
    reqs = _requests(n, stream, cfg.chunks if stream else 16)
    plan = Plan(launched.url, concurrency=concurrency, max_requests=n, max_time=cfg.max_time,
                stream=stream, prefix_hash_header=setup.prefix_hash_header,
                progress_label=f"{setup.name} {mode} c={concurrency}")
    result = _charged(launched.pid, acc, lambda: run(plan, reqs))
    for o in result.outcomes:
        if o.ok and o.e2e is not None:
            acc.ok += 1
            acc.e2e.append(o.e2e)
            acc.ttft.append(o.ttft if o.ttft is not None else o.e2e)
            acc.tokens += o.output_tokens
        else:
            acc.errors += 1
    acc.wall += result.wall_seconds


def _charged(pid: int | None, acc: _Acc, work: Callable[[], T]) -> T:
    """``work()``, its CPU time on ``pid``'s process tree added to ``acc.cpu`` (None: unknown)."""
    cpu0 = cpu_seconds(pid) if pid else None
    out = work()
    cpu1 = cpu_seconds(pid) if pid else None
    if cpu0 is None or cpu1 is None or acc.cpu is None:
        acc.cpu = None
    else:
        acc.cpu += cpu1 - cpu0
    return out


def _row(setup: str, mode: str, concurrency: int, acc: _Acc) -> dict[str, Any]:
    stream = mode != "plain"
    chunks = acc.tokens / acc.ok if acc.ok else 0.0
    per_req = acc.cpu_per_request
    return {"setup": setup, "mode": mode,
            "concurrency": concurrency, "requests": acc.ok, "errors": acc.errors,
            "latency": summarize(acc.e2e), "ttft": summarize(acc.ttft),
            "throughput": acc.throughput,
            "cpu_seconds": acc.cpu, "cpu_per_request": per_req,
            "cpu_per_chunk": per_req / chunks if per_req is not None and stream and chunks else None,
            "chunks_per_request": chunks}


async def closed_loop(url: str, bodies: Sequence[bytes], concurrency: int
                      ) -> tuple[int, int, float]:
    """POST every body to ``url``, ``concurrency`` at a time, reading each response body to its
    end and nothing more; (ok, errors, wall seconds). A client that costs little per request,
    so the server, not the client, sets the pace."""
    it = iter(bodies)
    ok = errors = 0
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def worker() -> None:
            nonlocal ok, errors
            for data in it:
                try:
                    async with session.post(url, data=data, headers=headers) as resp:
                        await resp.read()
                        if resp.status == 200:
                            ok += 1
                        else:
                            errors += 1
                except aiohttp.ClientError:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return ok, errors, time.perf_counter() - t0


def _capacity_round(launched: Launched, mode: str, n: int, cfg: OverheadConfig,
                    acc: _Acc) -> None:
    stream = mode != "plain"
    body = json.dumps(chat_body(stream, cfg.chunks if stream else 16)).encode()
    url = launched.url + "/v1/chat/completions"
    ok, errors, wall = _charged(launched.pid, acc, lambda: asyncio.run(
        closed_loop(url, [body] * n, cfg.concurrency)))
    acc.ok += ok
    acc.errors += errors
    acc.wall += wall


def _capacity_row(setup: str, mode: str, acc: _Acc) -> dict[str, Any]:
    return {"setup": setup, "mode": mode, "concurrency": None, "requests": acc.ok,
            "errors": acc.errors, "throughput": acc.throughput, "cpu_seconds": acc.cpu,
            "cpu_per_request": acc.cpu_per_request}


def _launch_all(setups: Sequence[Setup], fleet: Fleet, workdir: Path, suffix: str,
                skipped: dict[str, str], running: list[tuple[Setup, Launched]]) -> None:
    """Start every available setup in front of ``fleet``, each appended to ``running`` as soon
    as it runs (so an interruption part way still stops the ones already started)."""
    replicas = list(zip(fleet.names, fleet.urls, strict=True))
    for setup in setups:
        if setup.name in skipped:
            continue
        reason = setup.unavailable()
        if reason:
            skipped[setup.name] = reason
            continue
        try:
            launched = launch(setup, replicas, workdir / (setup.name + suffix))
            if setup.kind == "direct":
                # direct's cells measure the replica it targets: the capacity the router is
                # compared with
                pid = fleet.pids[fleet.urls.index(launched.url)]
                if pid is not None:
                    launched = Launched(setup, launched.url, None, None, pid=pid)
            running.append((setup, launched))
        except SetupError as exc:
            skipped[setup.name] = f"failed to start: {str(exc).splitlines()[0]}"


def _phase(setups: Sequence[Setup], fleet: Fleet, workdir: Path, suffix: str,
           skipped: dict[str, str], rounds: Callable[[list[tuple[Setup, Launched]]], None]) -> None:
    """Start ``fleet`` and the setups in front of it, run ``rounds`` over them, stop them all."""
    fleet.start()
    running: list[tuple[Setup, Launched]] = []
    try:
        _launch_all(setups, fleet, workdir, suffix, skipped, running)
        rounds(running)
    finally:
        for _, launched in running:
            launched.stop()
        fleet.stop()


def measure(setups: Sequence[Setup], cfg: OverheadConfig, workdir: Path,
            log: Any = None) -> dict[str, Any]:
    """All setups run at once in front of one fleet; the cells are interleaved in
    ``cfg.rounds`` rounds so drift in the machine's background load hits every setup alike.
    Then, unless ``cfg.paced_ms`` is 0, the same for token-paced streams in front of a second
    fleet (mode ``paced``: concurrency ``cfg.concurrency``, CPU per relayed chunk)."""
    skipped: dict[str, str] = {}
    cells = [(mode, conc, n) for mode in ("plain", "stream")
             for conc, n in ((1, cfg.latency_requests), (cfg.concurrency, cfg.cpu_requests))]
    accs: dict[tuple[str, str, int], _Acc] = {}

    def cell(setup: Setup, launched: Launched, mode: str, conc: int, n: int) -> None:
        acc = accs.setdefault((setup.name, mode, conc), _Acc())
        _round(launched, setup, mode, conc, max(1, n // cfg.rounds), cfg, acc)

    caps: dict[tuple[str, str], _Acc] = {}

    def capacity(running: list[tuple[Setup, Launched]]) -> None:
        n = max(1, cfg.capacity_requests // cfg.rounds)
        for mode in ("plain", "stream"):
            for setup, launched in running:
                if setup.kind in ("direct", "router"):
                    _capacity_round(launched, mode, n, cfg,
                                    caps.setdefault((setup.name, mode), _Acc()))

    def rounds(cells: list[tuple[str, int, int]], label: str, with_capacity: bool = False
               ) -> Callable[[list[tuple[Setup, Launched]]], None]:
        def run(running: list[tuple[Setup, Launched]]) -> None:
            for r in range(cfg.rounds):
                for mode, conc, n in cells:
                    for setup, launched in running:
                        cell(setup, launched, mode, conc, n)
                if with_capacity and cfg.capacity_requests > 0:
                    capacity(running)
                if log:
                    log(f"overhead: {label}round {r + 1}/{cfg.rounds} done")
        return run

    _phase(setups, Fleet(replicas=cfg.replicas, instant=True, log_dir=str(workdir / "fleet")),
           workdir, "", skipped, rounds(cells, "", with_capacity=True))
    if cfg.paced_ms > 0:
        # one token every paced_ms to every running stream: no prefill or per-sequence cost
        paced = Fleet(replicas=cfg.replicas, step_ms=cfg.paced_ms, prefill_us_per_token=0.0,
                      decode_us_per_seq=0.0, log_dir=str(workdir / "fleet-paced"))
        _phase(setups, paced, workdir, "-paced", skipped,
               rounds([("paced", cfg.concurrency, cfg.paced_requests)], "paced "))
    rows = [_row(name, mode, conc, acc) for (name, mode, conc), acc in accs.items()]
    names = [s.name for s in setups]
    rows.sort(key=lambda r: (names.index(r["setup"]),
                             ("plain", "stream", "paced").index(r["mode"]), r["concurrency"]))
    _added(rows)
    cap = [_capacity_row(name, mode, acc) for (name, mode), acc in caps.items()]
    return {"config": asdict(cfg), "rows": rows, "capacity": cap, "skipped": skipped,
            "ratios": ratios(rows, cap)}


def _added(rows: list[dict[str, Any]]) -> None:
    base = {(r["mode"], r["concurrency"]): r["latency"]["p50"] for r in rows
            if r["setup"] == "direct"}
    for r in rows:
        b = base.get((r["mode"], r["concurrency"]))
        r["added_p50"] = None if b is None else r["latency"]["p50"] - b


def _find(rows: Sequence[Mapping[str, Any]], prefix: str, mode: str,
          concurrency: int | None = None) -> Mapping[str, Any] | None:
    for r in rows:
        if (str(r["setup"]).startswith(prefix) and r["mode"] == mode
                and (concurrency is None or r["concurrency"] == concurrency)):
            return r
    return None


def ratios(rows: Sequence[Mapping[str, Any]],
           capacity: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """From the high-concurrency CPU runs of one run: the router (and the passthrough floor)
    vs sglang-router, nginx and the passthrough; one instant replica's capacity vs the
    router's (from the ``capacity`` cells, else the high-concurrency ones); and, at
    concurrency 1, the added p50 latencies."""
    conc = max((int(r["concurrency"]) for r in rows), default=1)
    out: dict[str, Any] = {}

    def ratio(ours: str, other: str, mode: str, key: str,
              cells: Sequence[Mapping[str, Any]] = rows, concurrency: int | None = conc
              ) -> float | None:
        mine = _find(cells, ours, mode, concurrency)
        theirs = _find(cells, other, mode, concurrency)
        if mine and theirs and mine.get(key) and theirs.get(key):
            return float(mine[key] / theirs[key])
        return None

    # CPU per chunk from token-paced streams when measured (the method), else from the
    # instant ones (whose chunks arrive in bursts)
    chunk_mode = "paced" if any(r["mode"] == "paced" for r in rows) else "stream"
    for ours, other in (("router", "sglang"), ("router", "nginx"), ("router", "passthrough"),
                        ("passthrough", "sglang")):
        prefix = "" if ours == "router" else f"{ours}_"
        for key, mode in (("cpu_per_request", "plain"), ("cpu_per_chunk", chunk_mode)):
            if (v := ratio(ours, other, mode, key)) is not None:
                out[f"{prefix}{key}_vs_{other}"] = v
    for mode in ("plain", "stream"):
        # One instant replica's capacity per core as a multiple of the router's (issue #3:
        # the replica must not be what limits a router benchmark): router CPU per request over
        # the replica's own CPU per request when hit directly, same requests, same run.
        # (capacity cells have no concurrency of their own)
        cells, c = (capacity, None) if _find(capacity, "direct", mode) else (rows, conc)
        if (v := ratio("router", "direct", mode, "cpu_per_request", cells, c)) is not None:
            out[f"replica_capacity_vs_router_{mode}"] = v
        r = _find(rows, "router", mode, 1)
        if r is not None:
            out[f"added_p50_c1_{mode}"] = r.get("added_p50")
        r = _find(rows, "passthrough", mode, 1)
        if r is not None:
            out[f"passthrough_added_p50_c1_{mode}"] = r.get("added_p50")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    c = OverheadConfig()
    p.add_argument("--setup", action="append", default=None,
                   help=f"repeatable; default: {', '.join(DEFAULT_SETUPS)} (direct is the baseline)")
    p.add_argument("--replicas", type=int, default=c.replicas)
    p.add_argument("--concurrency", type=int, default=c.concurrency)
    p.add_argument("--latency-requests", type=int, default=c.latency_requests)
    p.add_argument("--cpu-requests", type=int, default=c.cpu_requests)
    p.add_argument("--chunks", type=int, default=c.chunks)
    p.add_argument("--rounds", type=int, default=c.rounds)
    p.add_argument("--paced-ms", type=float, default=c.paced_ms,
                   help="token interval of the paced-stream cells (0 = skip them)")
    p.add_argument("--paced-requests", type=int, default=c.paced_requests)
    p.add_argument("--capacity-requests", type=int, default=c.capacity_requests,
                   help="requests per capacity cell (direct and the router, 0 = skip them)")
    p.add_argument("--out", help="JSON results")
    p.add_argument("--workdir", help="logs and configs (default: a temp dir)")


def main(args: argparse.Namespace) -> int:
    from loadtest.report import overhead_markdown, overhead_targets_markdown

    names = args.setup or list(DEFAULT_SETUPS)
    if "direct" not in names:
        names = ["direct", *names]
    try:
        setups = [parse_setup(s) for s in names]
    except ValueError as exc:
        print(f"prefix-loadtest overhead: {exc}", file=sys.stderr)
        return 2
    cfg = OverheadConfig(replicas=args.replicas, concurrency=args.concurrency,
                         latency_requests=args.latency_requests, cpu_requests=args.cpu_requests,
                         chunks=args.chunks, rounds=args.rounds, paced_ms=args.paced_ms,
                         paced_requests=args.paced_requests,
                         capacity_requests=args.capacity_requests)
    with tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
        res = measure(setups, cfg, Path(args.workdir or tmp),
                      log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(overhead_markdown(res["rows"]))
    print(overhead_targets_markdown(res["ratios"]))
    for name, why in res["skipped"].items():
        print(f"- {name} skipped: {why}")
    return 0
