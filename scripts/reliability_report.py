#!/usr/bin/env python3
"""Run the reliability suites at a larger scale and regenerate docs/reliability.md.

    python scripts/reliability_report.py                 # scale 5, writes docs/reliability.md
    python scripts/reliability_report.py --scale 1       # CI sizes
    python scripts/reliability_report.py --from-results results.json   # re-render only

It runs ``pytest tests/reliability`` in a subprocess with ``RELIABILITY_SCALE`` (load-loop counts
and hypothesis examples multiplied; the auditor's long line becomes 1 GiB at scale >= 4) and
``RELIABILITY_RESULTS`` (where the tests' ``measure`` fixture writes what it measured), reads the
per-test outcomes from a JUnit XML file, and renders the document: what each scenario did, its
measurements, and every test's outcome - xfails are open router bugs. The assertions are the
same as in CI plus the timing promises (``RELIABILITY_PROMISES=1``: "aborted within 100 ms"),
which CI only records; a failed expectation at scale shows up as a failed test in the document.
Run it under ``flock /work/.bench.lock``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
COMMAND = "python scripts/reliability_report.py"

# scenario key prefix -> (title, what it does). Order is the document's order.
SCENARIOS: list[tuple[str, str, str]] = [
    ("chaos_kill", "Chaos: kill -9 one replica",
     "Router process + 4 simulated replica processes (speed 5); 8 clients send short "
     "non-streamed requests and 8 clients long streams (1,024 tokens) over 32 prefix keys, each "
     "request a fresh conversation. One replica (the one owning most keys) is SIGKILLed after "
     "1 s; load continues 1 s after its ejection; then it is restarted. Key placement is read "
     "from `x-prefix-router-replica` (one request at a time, no load) before, during and after. "
     "The test fails if no stream was cut (the fault must land mid-stream)."),
    ("chaos_hang", "Chaos: one replica hangs",
     "16 clients, every third request a 256-token stream. One replica is SIGSTOPped (the "
     "kernel still accepts connections, nothing answers), SIGCONTed 2.5 s after its ejection. "
     "Streams "
     "stalled on it must end with an SSE error event within the idle timeout (1 s) plus a "
     "margin; requests waiting for its first byte are retried elsewhere (`test_hung_replica_"
     "loses_no_non_streamed_request`, first_byte_timeout 1 s, asserts none is lost)."),
    ("chaos_slow", "Chaos: one replica 10x slower",
     "16 clients (every third request streamed); replica 0 gets the `slow=10` fault for the "
     "whole run. Slow is not failed: no ejection, no error."),
    ("chaos_flap", "Chaos: one replica flaps",
     "16 clients (every third request streamed); one replica is SIGKILLed, restarted 1.5 s "
     "later, left up 1.5 s, twice."),
    ("chaos_all_down", "Chaos: all replicas down, then back",
     "All four replicas SIGKILLed; requests are sent one at a time; then all are restarted and "
     "the time until the first success is measured."),
    ("disconnect_mid_stream", "Disconnects: clients drop mid-stream",
     "In-process router (to count its asyncio tasks) in front of 4 replica processes (200 ms "
     "engine steps). N clients each open a long stream, read the first SSE chunk, then close "
     "(even) or reset (odd) the connection one at a time. After each drop two times are taken: "
     "until the router closed the upstream request (its in-flight count fell, polled "
     "in-process) and until the replica aborted it (the replica's own wall-clock abort stamp "
     "minus the drop time); every one of both must be <= 100 ms. Afterwards: requests "
     "dispatched vs sent, in-flight gauges, ESTABLISHED sockets of the router (from /proc), "
     "event-loop tasks."),
    ("disconnect_queued", "Disconnects: clients drop while queued",
     "Same, but replicas run with `--max-num-seqs 2` and requests are non-streamed, so all but "
     "8 wait in the replicas' queues when their client leaves."),
    ("fuzz", "Bad input (hypothesis)",
     "One router process in front of two upstreams that always answer 200, so any 5xx is the "
     "router's. Cases: arbitrary JSON bodies and prompt fields, wrong types, truncated / binary "
     "/ invalid-UTF-8 bodies, odd header names and values and content types, long URLs and odd "
     "methods, deep nesting, oversized bodies (declared, lying Content-Length, chunked)."),
    ("overload", "Overload",
     "2 replicas with `--max-num-seqs 2` (about 20 short requests/s), router "
     "`proxy.max_in_flight: 8`, 64 clients sending without pause for 3 s, then 20 sequential "
     "requests. Router in-flight and RSS sampled every 20 ms."),
    ("limits", "Connection-level limits",
     "Router processes with short `limits.*` deadlines (`tests/reliability/test_limits.py`). "
     "Slowloris: 1,000 connections each send a partial request head, then one header line "
     "every 0.5 s, against `header_timeout: 2`; 100 ordinary requests run alongside (10 at a "
     "time); held times run from the connection as the client saw it established to the close it "
     "saw (`held_from_connect_call_min_s`: from just before the connect call). Bodies: "
     "`body_timeout: 1`, `body_min_rate: 1MiB`; a body declared as 100,000 bytes trickled one "
     "byte per 0.1 s, then a 16 MiB chat body sent at 4 MiB/s to an upstream that counts the "
     "bytes. Heads (default limits): 5,000 header lines, 99 (accepted), one 64 KiB header, a 10 "
     "KiB request target. Cap: `max_connections: 50`, 50 idle connections held, then 200 x "
     "scale more opened at once. Descriptors are counted in /proc/<pid>/fd."),
    ("shutdown", "Shutdown (SIGTERM under load)",
     "8 open streams of ~3 s each, then SIGTERM to the router process, with a grace period "
     "longer (10 s) and shorter (1 s) than the streams."),
    ("security", "Security",
     "Canary string in the prompt, `user`, `X-Session-ID`, query string, Content-Type and "
     "Authorization of 9 requests (200, SSE, 401, 400, relayed 500) with `logging.level: "
     "debug` and the access log on; 500 distinct keys / users / sessions / X-Prefix-Hash "
     "values / paths against the series count of /metrics."),
    ("auditor", "Auditor on hostile input",
     "`python -m templates_audit FILE` as a subprocess per case; peak RSS from getrusage of a "
     "wrapper whose only child is the auditor."),
]


# Found by these suites; kept here so the document says what they already caught.
FIXED_BUGS = [
    "A first-byte timeout on a hung replica was answered 504 instead of being retried on the "
    "next candidate (`test_hung_replica_loses_no_non_streamed_request`: 5 non-streamed "
    "requests lost (504) while one replica was SIGSTOPped for 3 s).",
    "A connect timeout (aiohttp `ConnectionTimeoutError`, a `TimeoutError`) was translated to "
    "`UpstreamTimeout` and answered 504 instead of being retried like other connect failures "
    "(`test_connect_timeout_is_retried`, a loopback listener with a full accept queue).",
    "A replica that sent response headers but died before its first body chunk gave the client "
    "a 502 although nothing had been relayed (`test_stream_dying_before_first_chunk_is_retried`,"
    " the replica's `stop_after=0` fault; also seen once in the flap scenario).",
    "JSON nested ~1,000+ levels deep raised `RecursionError` in `json.loads` and was answered "
    "500 with a traceback in the log instead of 400 (`test_deeply_nested`).",
    "A chat message whose `role` is a list or an object (unhashable) raised `TypeError` in the "
    "routing-key derivation and was answered 500 instead of relayed (found by fuzzing outside "
    "these suites; now `test_wrong_message_fields`, which draws any JSON value for every "
    "message field).",
]
OBSERVATIONS = [
    "The replica's `refuse` fault (stop accepting new connections) does not make the replica "
    "look down to the router: its keep-alive pool and health-probe connections stay open and "
    "keep working. The flap scenario therefore kills and restarts the process instead.",
    "The router keeps a conversation on the replica that served its previous turn (conversation "
    "affinity). A conversation that spilled or failed over stays where it went; the placement "
    "checks use a fresh conversation per request, so they measure ring placement only.",
    "A stream that outlives `shutdown.grace_period` is cut when uvicorn cancels its task; the "
    "router then sends an SSE error event (`stream_cancelled`) and ends the chunked body, so "
    "the client sees why it stopped; the process still exits 0.",
    "With `auth.api_keys` set and no `admin` listener, `/metrics` on the main port is served "
    "without a key (it exposes replica names and counters, never prompts or keys).",
    "The router's RSS grows by ~0.5 KiB per distinct request in the fuzz run (5 MiB after 10k "
    "cases, 25 MiB after 51k), most likely its bounded LRUs filling (conversation affinity: "
    "65,536 conversations); the test bounds growth at 48 MiB. Not yet measured past the LRU "
    "sizes.",
    "Python's `json.loads` accepts an encoded surrogate (bytes ED A0 80) in a body; the router "
    "forwards such a body and leaves the verdict to the replica (never a 5xx).",
]


def run_suite(scale: float, results: Path, junit: Path, pytest_args: list[str]) -> int:
    env = {**os.environ, "RELIABILITY_SCALE": str(scale), "RELIABILITY_RESULTS": str(results),
           "RELIABILITY_PROMISES": "1"}
    cmd = [sys.executable, "-m", "pytest", "tests/reliability", "-p", "no:cacheprovider", "-q",
           "-o", "timeout=1800", f"--junitxml={junit}", *pytest_args]
    print("+", " ".join(cmd), f"(RELIABILITY_SCALE={scale})", flush=True)
    return subprocess.run(cmd, cwd=REPO, env=env).returncode


def outcomes(junit: Path) -> list[tuple[str, str, str]]:
    """(test id, outcome, message) per test case of a pytest JUnit XML file."""
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "FAILED", (child.get("message") or "")[:200]
            elif child.tag == "skipped":
                kind = child.get("type") or ""
                msg = child.get("message") or ""
                outcome = "xfail" if "xfail" in kind or "xfail" in msg else "skipped"
                message = msg.removeprefix("xfail").strip(" :-")[:300]
        rows.append((name, outcome, message))
    return rows


def _value(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_value(x)}" for k, x in v.items())
    if isinstance(v, list):
        return ", ".join(_value(x) for x in v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def render(measured: dict[str, dict[str, Any]], rows: list[tuple[str, str, str]],
           scale: float, meta: dict[str, str]) -> str:
    out = [
        "# Reliability and security",
        "",
        "Suites that break things on purpose: `tests/reliability/` (they run in CI at scale 1, "
        "marked `slow`). This document is generated - do not edit it by hand; regenerate it "
        "with",
        "",
        "```sh",
        f"{COMMAND}            # default --scale 5; --scale 1 reproduces the CI sizes",
        "```",
        "",
        f"which runs `pytest tests/reliability` with `RELIABILITY_SCALE={scale:g}` (load counts "
        "and hypothesis examples multiplied, the auditor's long line 1 GiB from scale 4) and "
        "writes every measured value below. Each value is asserted against a bound in the tests "
        "(bounds are generous for a loaded 2-core CI box; the measured values are what this "
        "machine did).",
        "",
        f"Run: {meta['date']}, commit `{meta['commit']}`, {meta['machine']}, scale {scale:g}.",
        "",
    ]
    passed = sum(o == "passed" for _, o, _ in rows)
    failed = [r for r in rows if r[1] == "FAILED"]
    xfails = [r for r in rows if r[1] == "xfail"]
    out += [f"Outcome: {passed} passed, {len(failed)} failed, {len(xfails)} xfailed "
            "(known router bugs, listed at the end), "
            f"{sum(o == 'skipped' for _, o, _ in rows)} skipped.", ""]
    for prefix, title, what in SCENARIOS:
        keys = sorted(k for k in measured if k.startswith(prefix))
        out += [f"## {title}", "", what, ""]
        if not keys:
            out += ["(not measured in this run)", ""]
            continue
        for key in keys:
            if len(keys) > 1:
                out += [f"**{key}**", ""]
            out += ["| measured | value |", "|---|---|"]
            out += [f"| {k} | {_value(v)} |" for k, v in measured[key].items()]
            out.append("")
    out += limits_table()
    out += ["## Test outcomes", "", "| test | outcome | note |", "|---|---|---|"]
    out += [f"| `{name}` | {o} | {msg.replace('|', '/')} |" for name, o, msg in rows]
    out += ["", "## Router bugs these suites found (fixed)", ""]
    out += [f"- {b}" for b in FIXED_BUGS]
    out += ["", "## Observations (not asserted)", ""]
    out += [f"- {o}" for o in OBSERVATIONS]
    out += ["", "## Open router bugs (xfail, strict)", ""]
    out += [f"- `{name}`: {msg}" for name, _, msg in xfails] or ["None."]
    out += ["", "Each is marked `xfail(strict=True)`: once the router is fixed the test passes, "
            "the strict xfail turns that into a failure, and the mark must be removed.", ""]
    return "\n".join(out)


# limits.* setting -> (nginx's directive and default, what uvicorn alone does). The router's
# defaults are read from router.settings, where they live.
NGINX_LIMITS: list[tuple[str, str, str]] = [
    ("header_timeout", "`client_header_timeout 60s` (408)", "none: a partial head is held forever"),
    ("body_timeout", "`client_body_timeout 60s`, between two reads (408)", "none"),
    ("body_min_rate", "none", "none"),
    ("keepalive_timeout", "`keepalive_timeout 75s`", "`timeout_keep_alive` 5 s (used by the router)"),
    ("max_request_line", "one `large_client_header_buffers` buffer, 8k (414)", "none"),
    ("max_header_count", "none, bounded by the buffers", "none (h11: none)"),
    ("max_header_bytes", "`large_client_header_buffers 4 8k`; one field per 8k buffer (400)",
     "none (h11: 16 KiB, answered 400)"),
    ("max_connections", "`worker_connections 512` per worker, upstream included",
     "`limit_concurrency` off; checked after the head, plain-text 503"),
    ("max_connections_per_client", "none (`limit_conn` is opt-in)", "none"),
]


_BYTES = ("body_min_rate", "max_request_line", "max_header_bytes")


def limits_table() -> list[str]:
    from router.settings import LimitsSettings

    defaults = LimitsSettings()
    rows = ["## Connection limits next to nginx's defaults", "",
            "The router's defaults (`router/settings.py`, section `limits`; docs/router.md, "
            "Connection limits, says which layer enforces each and why):", "",
            "| setting | router default | nginx default | uvicorn 0.54 alone |", "|---|---|---|---|"]
    for name, nginx, uvicorn in NGINX_LIMITS:
        value = getattr(defaults, name)
        if isinstance(value, float):
            shown = f"{value:g} s"
        elif name in _BYTES:
            shown = f"{value // 1024} KiB" + ("/s" if name == "body_min_rate" else "")
        else:
            shown = str(value) if value else "off (0)"
        rows.append(f"| `limits.{name}` | {shown} | {nginx} | {uvicorn} |")
    return [*rows, ""]


def _meta() -> dict[str, str]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip() or "unknown"
    return {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
            "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
                       f"{platform.system()} {platform.release()}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--scale", type=float, default=5.0, help="count multiplier (CI uses 1)")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "reliability.md")
    p.add_argument("--from-results", type=Path, metavar="JSON",
                   help="render a previous run's results (with its .junit.xml next to it)")
    p.add_argument("--keep", type=Path, metavar="JSON", help="also keep the raw results here")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments, e.g. -k chaos")
    args = p.parse_args(argv)
    code = 0
    if args.from_results:
        results = args.from_results
        junit = results.with_suffix(".junit.xml")
    else:
        tmp = Path(tempfile.mkdtemp(prefix="reliability-"))
        results = args.keep or tmp / "results.json"
        junit = results.with_suffix(".junit.xml")
        results.unlink(missing_ok=True)
        code = run_suite(args.scale, results, junit, args.pytest_args)
    measured = json.loads(results.read_text()) if results.exists() else {}
    rows = outcomes(junit) if junit.exists() else []
    args.out.write_text(render(measured, rows, args.scale, _meta()))
    print(f"wrote {args.out} ({len(measured)} scenarios, {len(rows)} tests; pytest exit {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
