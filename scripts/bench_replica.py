"""CPU per request of an `--instant` simulated replica next to `prefix-router serve`, in one run.

    python scripts/bench_replica.py                      # ~1-2 min on 2 shared cores
    python scripts/bench_replica.py --requests 1500 --rounds 2 --json out.json
    git archive <commit> loadtest templates_audit | tar -x -C /tmp/old
    python scripts/bench_replica.py --baseline /tmp/old     # + that version's replica, same run

Starts two instant replicas (`Fleet(replicas=2, instant=True)`, one process each) and the router
(`python -m router.cli serve --backend <replica 1> --port P`, one uvicorn worker). Then, in
``--rounds`` interleaved rounds, four cells: replica 0 hit directly and the router (in front of
replica 1), each non-streamed and streamed. A cell is a closed loop of ``--concurrency`` (16)
aiohttp coroutines sending ``--requests`` chat requests in all and reading every body to the end.

Two workloads (``--workload``, default both):

* ``unique`` - realistic for a prefix-cached fleet: one ~850-token system prompt shared by all, a
  unique user turn each (a ticket number and a random hex id), so every request is rendered,
  tokenised and hashed past the system prompt;
* ``fixed`` - the body the router-overhead benchmark (`prefix-loadtest overhead`, `make bench`)
  sends again and again (`loadtest.overhead.chat_body`: a ~1.5k-character system prompt and a
  short user turn), which the replica answers from its per-body memo.

Both use ``--max-tokens`` (default 16; the router benchmark's streams are 64 chunks) and, streamed,
``stream_options.include_usage``.

What is reported per cell: requests/s (wall clock: depends on how busy the shared box is) and
**CPU per request** = utime+stime (``/proc/<pid>/stat``) of the server process over the cell,
divided by the requests completed, which does not depend on the box's load. For the router cells
the backend replica's CPU per request is shown too. The closing lines give, per mode, the
replica's capacity per core as a multiple of the router's: router CPU/request divided by replica
CPU/request (the target of issue #3 is >= 3). ``--baseline DIR`` adds the cells of an instant
replica run from another source tree (``python -m loadtest replica`` with DIR first on the path),
to compare two versions in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loadtest._net import free_port, http_ok
from loadtest.fleet import Fleet
from loadtest.overhead import chat_body, closed_loop
from loadtest.setups import cpu_seconds
from loadtest.workloads import synthetic_text

SYSTEM_WORDS = 570   # ~850 tokens with the default tokeniser and the ChatML template


def system_prompt() -> str:
    return ("You are the ACME help desk assistant. Answer briefly and cite the policy section.\n"
            + synthetic_text(random.Random(7), SYSTEM_WORDS))


def _encode(obj: dict[str, Any], stream: bool) -> bytes:
    if stream:
        obj["stream_options"] = {"include_usage": True}
    return json.dumps(obj).encode()


@functools.cache
def _fixed_body(stream: bool, max_tokens: int) -> bytes:
    """The overhead benchmark's body (one for every request), built once."""
    return _encode(chat_body(stream, max_tokens), stream)


def body(i: int, stream: bool, system: str, workload: str = "unique",
         max_tokens: int = 16) -> bytes:
    if workload == "fixed":
        return _fixed_body(stream, max_tokens)
    obj = {
        "model": "sim-model", "max_tokens": max_tokens, "temperature": 0, "stream": stream,
        "messages": [{"role": "system", "content": system},
                     {"role": "user", "content": f"Ticket {i} ({random.getrandbits(48):x}): "
                                                 "how do I reset my password?"}]}
    return _encode(obj, stream)


@dataclass
class Cell:
    target: str     # "replica", "router" or "baseline"
    workload: str   # "unique" or "fixed"
    mode: str       # "plain" or "stream"
    requests: int = 0
    errors: int = 0
    wall: float = 0.0
    cpu: float = 0.0           # the target process
    backend_cpu: float = 0.0   # the replica behind the router (router cells)

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu / self.requests if self.requests else float("nan")

    @property
    def backend_cpu_ms(self) -> float:
        return 1000 * self.backend_cpu / self.requests if self.requests else float("nan")

    @property
    def rate(self) -> float:
        return self.requests / self.wall if self.wall else 0.0


def run_cell(cell: Cell, url: str, pid: int, backend_pid: int | None, n: int, concurrency: int,
             system: str, warmup: int = 200, max_tokens: int = 16) -> None:
    stream = cell.mode == "stream"
    asyncio.run(closed_loop(url, [body(i, stream, system, cell.workload, max_tokens)
                                  for i in range(warmup)], concurrency))
    bodies = [body(i, stream, system, cell.workload, max_tokens) for i in range(n)]
    c0 = cpu_seconds(pid)
    b0 = cpu_seconds(backend_pid) if backend_pid else 0.0
    ok, errors, wall = asyncio.run(closed_loop(url, bodies, concurrency))
    cell.cpu += cpu_seconds(pid) - c0
    if backend_pid:
        cell.backend_cpu += cpu_seconds(backend_pid) - b0
    cell.requests += ok
    cell.errors += errors
    cell.wall += wall


def _start(argv: list[str], what: str, **popen: Any) -> tuple[subprocess.Popen[bytes], str]:
    """Start a server on a free port (``argv`` gets ``--port``) and wait for its /health."""
    port = free_port()
    proc = subprocess.Popen([*argv, "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, **popen)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if http_ok(url + "/health"):
            return proc, url
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError(f"{what} did not become healthy")


def start_router(backend: str) -> tuple[subprocess.Popen[bytes], str]:
    return _start([sys.executable, "-m", "router.cli", "serve", "--backend", backend,
                   "--host", "127.0.0.1"], "router")


def start_baseline(src: str) -> tuple[subprocess.Popen[bytes], str]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    return _start([sys.executable, "-m", "loadtest", "replica", "--instant", "--name",
                   "sim-base"], "baseline replica", cwd=src, env=env)


def prompt_tokens(url: str, system: str) -> int:
    data = json.dumps({"model": "sim-model", "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "x"}]}).encode()
    req = urllib.request.Request(url + "/tokenize", data=data,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return int(json.loads(resp.read())["count"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000, help="requests per cell and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=16,
                   help="tokens per reply (stream chunks); the router benchmark streams 64")
    p.add_argument("--workload", choices=["unique", "fixed", "both"], default="both")
    p.add_argument("--skip-router", action="store_true", help="measure the replica only")
    p.add_argument("--baseline", metavar="DIR",
                   help="also measure an instant replica run from this source tree")
    p.add_argument("--json", help="also write the cells here")
    args = p.parse_args(argv)

    system = system_prompt()
    targets = ["replica"] + ([] if args.skip_router else ["router"]) + (
        ["baseline"] if args.baseline else [])
    workloads = ["unique", "fixed"] if args.workload == "both" else [args.workload]
    cells = {(t, w, m): Cell(t, w, m) for t in targets for w in workloads
             for m in ("plain", "stream")}
    with Fleet(replicas=2, instant=True) as fleet:
        pids = [int(pid) for pid in fleet.pids if pid is not None]
        print(f"system prompt + user turn: {prompt_tokens(fleet.urls[0], system)} prompt tokens",
              flush=True)
        router = base = None
        try:
            if not args.skip_router:
                router, router_url = start_router(fleet.urls[1])
            if args.baseline:
                base, base_url = start_baseline(args.baseline)
            for rnd in range(args.rounds):
                for (target, workload, mode), cell in cells.items():
                    if target == "replica":
                        url, pid, backend = fleet.urls[0], pids[0], None
                    elif target == "baseline":
                        assert base is not None
                        url, pid, backend = base_url, base.pid, None
                    else:
                        assert router is not None
                        url, pid, backend = router_url, router.pid, pids[1]
                    run_cell(cell, url + "/v1/chat/completions", pid, backend, args.requests,
                             args.concurrency, system, max_tokens=args.max_tokens)
                    print(f"round {rnd + 1} {target:8s} {workload:6s} {mode:6s} {cell.requests:6d} req "
                          f"{cell.rate:7.1f} req/s  cpu {cell.cpu_ms:.3f} ms/req"
                          + (f"  (backend {cell.backend_cpu_ms:.3f})" if backend else ""),
                          flush=True)
        finally:
            for proc in (router, base):
                if proc is not None:
                    proc.terminate()
                    proc.wait(10)
    print()
    print(f"{'target':9s} {'workload':8s} {'mode':6s} {'requests':>8s} {'errors':>6s} "
          f"{'req/s':>7s} {'CPU ms/req':>10s} {'backend':>8s}")
    for c in cells.values():
        back = f"{c.backend_cpu_ms:8.3f}" if c.target == "router" else f"{'':8s}"
        print(f"{c.target:9s} {c.workload:8s} {c.mode:6s} {c.requests:8d} {c.errors:6d} "
              f"{c.rate:7.1f} {c.cpu_ms:10.3f} {back}")
    for w in workloads:
        for mode in ("plain", "stream"):
            replica = cells["replica", w, mode].cpu_ms
            if not args.skip_router:
                ratio = cells["router", w, mode].cpu_ms / replica
                print(f"{w} {mode}: replica capacity per core = {ratio:.2f}x the router's")
            if args.baseline:
                print(f"{w} {mode}: baseline replica CPU/request = "
                      f"{cells['baseline', w, mode].cpu_ms / replica:.2f}x this one's")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([asdict(c) | {"cpu_ms": c.cpu_ms, "rate": c.rate} for c in cells.values()],
                      fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
