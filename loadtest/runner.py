"""`prefix-loadtest run`: drive a workload against a router (or one replica) and measure it.

Two schedules, both bounded in count (``--requests``) and time (``--duration``), with a hard
deadline (``--max-time``) after which every request still open is cancelled and counted as a
``deadline`` error and every request not yet sent is counted as ``not_sent``:

* open loop (``--rate R``): request i is sent at its workload arrival offset ``at``, rescaled so
  the mean arrival rate is exactly R (the synthetic workloads are Poisson; mooncake keeps its
  trace's burstiness). Sending never waits for answers, so an overloaded target shows up as
  growing latency, not as a slower client.
* closed loop (``--concurrency C``): C workers, each sends its next request as soon as the
  previous one ended. Turn order inside a conversation is kept by the workload's order.

Measurements (`summarize_run`, pure): TTFT / E2E / ITL percentiles over successful requests,
request and output-token throughput over the run's wall time, errors by `ErrorKind`; from the
replicas' own ``/metrics`` scraped before and after the run: the fleet's prefix-cache hit rate
(delta of ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``) and the requests
each replica received (delta of ``sim:requests_total``, else ``vllm:request_success_total``);
from the ``x-prefix-router-replica`` / ``x-replica-name`` response headers: requests and busy
time per replica (busy = length of the union of the replica's request intervals, i.e. the time it
had at least one of our requests open). Load balance is max/mean over *all* scraped replicas, so
a replica that got nothing counts as 0.

Cost: the client is one asyncio loop with a keep-alive pool; per request it does one POST and
one JSON decode per SSE event. Prefix-hash headers (for nginx) are computed before the clock
starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from loadtest.client import ErrorKind, Outcome, new_session, send
from loadtest.progress import Progress
from loadtest.stats import (
    QUERIES,
    counter_delta,
    fleet_hit_rate,
    max_over_mean,
    parse_prometheus,
    summarize,
)
from loadtest.workloads import Request, WorkloadSpec, generate

__all__ = [
    "DEFAULT_TRACE",
    "Plan",
    "RunResult",
    "add_arguments",
    "add_workload_arguments",
    "busy_seconds",
    "main",
    "prefix_hash_headers",
    "run",
    "scale_arrivals",
    "scrape",
    "summarize_run",
    "workload_spec",
]

def _default_trace() -> str:
    """``../shared/data/traces/conversation_trace.jsonl`` next to the checkout, or next to one of
    its parents (a git worktree under a directory beside the shared data)."""
    root = Path(__file__).resolve().parents[1]
    rel = Path("shared") / "data" / "traces" / "conversation_trace.jsonl"
    for d in root.parents:
        if (d / rel).is_file():
            return str(d / rel)
    return str(root.parent / rel)


DEFAULT_TRACE = _default_trace()
_REQUEST_COUNTERS = ("sim:requests_total", "vllm:request_success_total")


@dataclass(frozen=True)
class Plan:
    """How to drive the target. Exactly one of ``rate`` / ``concurrency``."""

    target: str  # base URL (router, nginx, a replica)
    rate: float | None = None
    concurrency: int | None = None
    duration: float | None = None  # stop sending after this many seconds
    max_requests: int | None = None
    max_time: float = 600.0  # hard deadline for the whole run
    request_timeout: float = 300.0
    stream: bool = True
    prefix_hash_header: str | None = None  # e.g. "X-Prefix-Hash" for nginx
    replica_urls: tuple[str, ...] = ()
    progress_label: str = ""

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("exactly one of rate (open loop) and concurrency (closed loop)")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate: expected > 0, got {self.rate}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency: expected >= 1, got {self.concurrency}")
        if self.duration is None and self.max_requests is None:
            raise ValueError("a run needs a bound: duration and/or max_requests")

    @property
    def mode(self) -> str:
        return "open" if self.rate is not None else "closed"


@dataclass(frozen=True)
class RunResult:
    plan: dict[str, Any]
    workload: dict[str, Any]
    wall_seconds: float
    outcomes: tuple[Outcome, ...]
    not_sent: int
    before: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    after: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return summarize_run(self.outcomes, self.wall_seconds, self.before, self.after,
                             not_sent=self.not_sent)

    def to_json(self, outcomes: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"plan": self.plan, "workload": self.workload,
                               "summary": self.summary()}
        if outcomes:
            out["outcomes"] = [o.to_json() for o in self.outcomes]
        return _finite(out)


# -- pure measurement ----------------------------------------------------------------------------
def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of ``[start, end)`` intervals (O(n log n))."""
    total = 0.0
    cur_s = cur_e = -math.inf
    for s, e in sorted(intervals):
        if s > cur_e:
            total += max(0.0, cur_e - cur_s) if cur_e > -math.inf else 0.0
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e > -math.inf:
        total += cur_e - cur_s
    return total


def _requests_counter(snap: Mapping[str, float]) -> str | None:
    return next((name for name in _REQUEST_COUNTERS if name in snap), None)


def summarize_run(outcomes: Sequence[Outcome], wall: float,
                  before: Mapping[str, Mapping[str, float]],
                  after: Mapping[str, Mapping[str, float]], *, not_sent: int = 0) -> dict[str, Any]:
    ok = [o for o in outcomes if o.ok]
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}  # the first detail of each kind, to tell what went wrong
    for o in outcomes:
        if o.error is not None:
            errors[str(o.error)] = errors.get(str(o.error), 0) + 1
            examples.setdefault(str(o.error), o.detail)
    itl = [x for o in ok for x in o.itl]
    out_tokens = sum(o.output_tokens for o in ok)
    by_header: dict[str, int] = {}
    intervals: dict[str, list[tuple[float, float]]] = {}
    for o in outcomes:
        if o.replica is not None:
            by_header[o.replica] = by_header.get(o.replica, 0) + 1
            if o.e2e is not None:
                intervals.setdefault(o.replica, []).append((o.start, o.start + o.e2e))
    per_replica: dict[str, dict[str, float]] = {}
    for name, snap in after.items():
        prev = before.get(name, {})
        counter = _requests_counter(snap)
        per_replica[name] = {
            "requests": counter_delta(prev, snap, counter) if counter else math.nan,
            "prompt_tokens": counter_delta(prev, snap, "vllm:prompt_tokens_total"),
            "hit_tokens": counter_delta(prev, snap, "vllm:prefix_cache_hits_total"),
            "query_tokens": counter_delta(prev, snap, QUERIES),
        }
    for name in set(by_header) | set(per_replica):
        row = per_replica.setdefault(name, {"requests": math.nan})
        row["requests_seen"] = by_header.get(name, 0)
        row["busy_seconds"] = busy_seconds(intervals.get(name, []))
    scraped = [r["requests"] for r in per_replica.values() if not math.isnan(r["requests"])]
    load = scraped if scraped else list(by_header.values())
    hit = fleet_hit_rate(before, after) if after else {}
    return {
        "requests": len(outcomes) + not_sent,
        "sent": len(outcomes),
        "ok": len(ok),
        "not_sent": not_sent,
        "errors": dict(sorted(errors.items())),
        "error_examples": dict(sorted(examples.items())),
        "error_count": len(outcomes) - len(ok) + not_sent,
        "wall_seconds": wall,
        "ttft": summarize([o.ttft for o in ok if o.ttft is not None]),
        "e2e": summarize([o.e2e for o in ok if o.e2e is not None]),
        "itl": summarize(itl),
        "request_throughput": len(ok) / wall if wall > 0 else math.nan,
        "output_token_throughput": out_tokens / wall if wall > 0 else math.nan,
        "output_tokens": out_tokens,
        "hit_rate": hit.get("fleet", math.nan) if hit else math.nan,
        "hit_tokens": hit.get("hit_tokens", 0.0),
        "query_tokens": hit.get("query_tokens", 0.0),
        "per_replica": dict(sorted(per_replica.items())),
        "load_max_over_mean": max_over_mean(load) if load else math.nan,
        "load_source": "replica counters" if scraped else "response headers",
    }


def _finite(obj: Any) -> Any:
    """NaN/inf -> None, so the JSON is standard."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


# -- workload helpers ------------------------------------------------------------------------------
def scale_arrivals(requests: Sequence[Request], rate: float) -> list[Request]:
    """Shift arrivals to start at 0 and stretch them so the mean rate is ``rate``."""
    if not requests:
        return []
    t0 = requests[0].at
    span = requests[-1].at - t0
    if len(requests) < 2 or span <= 0:
        return [replace(r, at=i / rate) for i, r in enumerate(requests)]
    factor = (len(requests) - 1) / rate / span
    return [replace(r, at=(r.at - t0) * factor) for r in requests]


def prefix_hash_headers(requests: Sequence[Request], header: str) -> list[dict[str, str]]:
    """The ``header: router.client.hash_key(body)`` each request carries (nginx deployments),
    and ``X-Model`` (an nginx config with one upstream per model picks it by that header)."""
    from router.client import MODEL_HEADER, hash_key

    out = []
    for r in requests:
        key = hash_key(r.body, r.path)
        headers = {header: key} if key is not None else {}
        model = r.body.get("model")
        if isinstance(model, str) and model:
            headers[MODEL_HEADER] = model
        out.append(headers)
    return out


# -- scraping -------------------------------------------------------------------------------------
async def scrape(session: aiohttp.ClientSession, urls: Sequence[str],
                 scrape_timeout: float = 5.0) -> dict[str, dict[str, float]]:
    """``{replica name: {metric: value}}``; the name is the replica's ``x-replica-name``."""

    async def one(url: str) -> tuple[str, dict[str, float]]:
        async with session.get(url.rstrip("/") + "/metrics",
                               timeout=aiohttp.ClientTimeout(total=scrape_timeout)) as resp:
            text = await resp.text()
            return resp.headers.get("x-replica-name") or url, parse_prometheus(text)

    pairs = await asyncio.gather(*(one(u) for u in urls))
    return dict(pairs)


# -- driving ---------------------------------------------------------------------------------------
class _Driver:
    def __init__(self, plan: Plan, requests: Sequence[Request],
                 headers: Sequence[Mapping[str, str]], session: aiohttp.ClientSession) -> None:
        self.plan = plan
        self.requests = requests
        self.headers = headers
        self.session = session
        self.outcomes: list[Outcome] = []
        self.errors = 0
        self.open: dict[asyncio.Task[Outcome], tuple[int, float]] = {}
        self.t0 = 0.0
        self.sent = 0
        self.progress = Progress(len(requests), plan.progress_label or plan.target)

    def _bodies(self) -> list[bytes]:
        return [r.json_bytes() for r in self.requests]

    async def _one(self, i: int, body: bytes) -> Outcome:
        r = self.requests[i]
        url = self.plan.target.rstrip("/") + r.path
        return await send(self.session, url, body, idx=r.idx, t_origin=self.t0,
                          headers=self.headers[i] if self.headers else None,
                          stream=self.plan.stream, group=r.group,
                          request_timeout=self.plan.request_timeout)

    def _record(self, o: Outcome) -> None:
        self.outcomes.append(o)
        self.errors += not o.ok
        self.progress.update(len(self.outcomes), self.errors)

    async def _open_loop(self, bodies: list[bytes], stop_at: float) -> None:
        for i, r in enumerate(self.requests):
            when = self.t0 + r.at
            if when >= stop_at:
                break
            delay = when - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self._one(i, bodies[i]))
            self.open[task] = (i, time.perf_counter() - self.t0)
            task.add_done_callback(self._done)
            self.sent += 1

    def _done(self, task: asyncio.Task[Outcome]) -> None:
        where = self.open.pop(task, None)
        if task.cancelled():
            return  # recorded as a deadline error by whoever cancelled it
        exc = task.exception()
        if exc is None:
            self._record(task.result())
        elif where is not None:
            r = self.requests[where[0]]
            self._record(Outcome(r.idx, where[1], error=ErrorKind.PROTOCOL,
                                 detail=f"{type(exc).__name__}: {exc}"[:200], group=r.group))

    async def _closed_loop(self, bodies: list[bytes], stop_at: float) -> None:
        cursor = iter(range(len(self.requests)))

        async def worker() -> None:
            for i in cursor:
                if time.perf_counter() >= stop_at:
                    return
                self.sent += 1
                task = asyncio.create_task(self._one(i, bodies[i]))
                self.open[task] = (i, time.perf_counter() - self.t0)
                task.add_done_callback(self._done)
                # shield: cancelling the worker at the deadline must leave the request open,
                # so it is counted as a deadline error rather than vanishing
                await asyncio.shield(task)

        assert self.plan.concurrency is not None
        await asyncio.gather(*(worker() for _ in range(self.plan.concurrency)))

    async def run(self) -> tuple[float, int]:
        bodies = self._bodies()
        self.t0 = time.perf_counter()
        hard = self.t0 + self.plan.max_time
        stop_at = min(hard, self.t0 + (self.plan.duration if self.plan.duration else math.inf))
        schedule = (self._open_loop(bodies, stop_at) if self.plan.mode == "open"
                    else self._closed_loop(bodies, stop_at))
        sender = asyncio.create_task(schedule)
        try:
            await asyncio.wait_for(asyncio.shield(sender), timeout=max(0.0, hard - time.perf_counter()))
        except TimeoutError:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        if self.open:
            await asyncio.wait(list(self.open), timeout=max(0.0, hard - time.perf_counter()))
        for task, (i, start) in list(self.open.items()):
            if task.done():
                continue  # finished in time; its done-callback records it
            self.open.pop(task, None)
            task.cancel()
            r = self.requests[i]
            self._record(Outcome(r.idx, start, error=ErrorKind.DEADLINE,
                                 detail=f"open at the {self.plan.max_time:g}s hard deadline",
                                 group=r.group))
        wall = time.perf_counter() - self.t0
        await asyncio.sleep(0)  # let pending done-callbacks record their outcomes
        self.progress.close()
        return wall, len(self.requests) - self.sent


async def run_async(plan: Plan, requests: Sequence[Request],
                    workload: Mapping[str, Any] | None = None) -> RunResult:
    reqs = list(requests[: plan.max_requests] if plan.max_requests is not None else requests)
    if plan.rate is not None:
        reqs = scale_arrivals(reqs, plan.rate)
    headers = (prefix_hash_headers(reqs, plan.prefix_hash_header)
               if plan.prefix_hash_header else [])
    async with new_session(timeout=plan.request_timeout) as session:
        before = await scrape(session, plan.replica_urls) if plan.replica_urls else {}
        driver = _Driver(plan, reqs, headers, session)
        wall, not_sent = await driver.run()
        after = await scrape(session, plan.replica_urls) if plan.replica_urls else {}
    outcomes = tuple(sorted(driver.outcomes, key=lambda o: o.start))
    plan_json = {k: getattr(plan, k) for k in ("target", "rate", "concurrency", "duration",
                                               "max_requests", "max_time", "stream",
                                               "prefix_hash_header")}
    plan_json["mode"] = plan.mode
    plan_json["replica_urls"] = list(plan.replica_urls)
    return RunResult(plan_json, dict(workload or {}), wall, outcomes, not_sent, before, after)


def run(plan: Plan, requests: Sequence[Request],
        workload: Mapping[str, Any] | None = None) -> RunResult:
    """Drive ``requests`` per ``plan`` (blocking; starts its own event loop)."""
    return asyncio.run(run_async(plan, requests, workload))


# -- CLI -------------------------------------------------------------------------------------------
def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--prompts", type=int, default=8, help="distinct system prompts")
    g.add_argument("--min-prompt-tokens", type=int, default=1000)
    g.add_argument("--max-prompt-tokens", type=int, default=4000)
    g.add_argument("--max-tokens", type=int, default=16, help="completion length per request")
    g.add_argument("--turns", type=int, default=4, help="turns per conversation")
    g.add_argument("--hot-fraction", type=float, default=0.8)
    g.add_argument("--model", default="sim-model")
    g.add_argument("--trace", default=DEFAULT_TRACE, help="mooncake: trace JSONL")
    g.add_argument("--time-scale", type=float, default=1.0,
                   help="mooncake: trace seconds per replay second")
    g.add_argument("--max-output-tokens", type=int, default=64, help="mooncake: output cap")
    g.add_argument("--documents", type=int, default=200, help="rag: shared document pool")
    g.add_argument("--min-doc-tokens", type=int, default=200, help="rag: document sizes")
    g.add_argument("--max-doc-tokens", type=int, default=800)
    g.add_argument("--min-history-tokens", type=int, default=8000,
                   help="agent: a conversation's last prompt is drawn in this range")
    g.add_argument("--max-history-tokens", type=int, default=20000)
    g.add_argument("--user-tokens", type=int, default=0,
                   help="shared-prefix, multi-turn, hot-prefix: pasted text after each question")


def workload_spec(args: argparse.Namespace, name: str, requests: int, rate: float,
                  stream: bool) -> WorkloadSpec:
    return WorkloadSpec(name, requests=requests, rate=rate, seed=args.seed, prompts=args.prompts,
                        min_prompt_tokens=args.min_prompt_tokens,
                        max_prompt_tokens=args.max_prompt_tokens, max_tokens=args.max_tokens,
                        turns=args.turns, hot_fraction=args.hot_fraction, model=args.model,
                        stream=stream, trace_path=args.trace, time_scale=args.time_scale,
                        max_output_tokens=args.max_output_tokens, documents=args.documents,
                        min_doc_tokens=args.min_doc_tokens, max_doc_tokens=args.max_doc_tokens,
                        min_history_tokens=args.min_history_tokens,
                        max_history_tokens=args.max_history_tokens,
                        user_tokens=args.user_tokens)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="base URL of the router / nginx / a replica")
    p.add_argument("--workload", required=True, help="a named workload or a JSONL file of bodies")
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=float, help="open loop: mean arrivals per second")
    load.add_argument("--concurrency", type=int, help="closed loop: concurrent workers")
    p.add_argument("--duration", type=float, help="stop sending after S seconds")
    p.add_argument("--requests", type=int, help="send at most N requests")
    p.add_argument("--max-time", type=float, default=None,
                   help="hard deadline (s): cancel what is still open (default: duration + 60, "
                        "else 600)")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--prefix-hash-header", default=None, metavar="HEADER",
                   help="send HEADER: router.client.hash_key(body) (nginx deployments)")
    p.add_argument("--replica-url", action="append", default=[],
                   help="a replica to scrape /metrics of (repeatable)")
    p.add_argument("--router-config", help="discover the replicas from this router.yaml")
    p.add_argument("--out", help="write JSON results here")
    p.add_argument("--markdown", help="write the markdown summary here (default: stdout)")
    add_workload_arguments(p)


def _replica_urls(args: argparse.Namespace) -> list[str]:
    urls = list(args.replica_url)
    if args.router_config:
        from router.settings import load_settings

        urls += [r.url for r in load_settings(args.router_config).replicas]
    return urls


def main(args: argparse.Namespace) -> int:
    from loadtest.report import run_markdown

    if args.duration is None and args.requests is None:
        print("prefix-loadtest run: give --duration and/or --requests", file=sys.stderr)
        return 2
    rate = args.rate if args.rate is not None else 10.0
    if args.requests is not None:
        n = args.requests
    elif args.rate is not None:
        n = int(args.rate * args.duration * 1.2) + 10
    else:
        n = min(5000, args.concurrency * int(args.duration) * 20 + 100)
    try:
        requests = generate(workload_spec(args, args.workload, n, rate, args.stream))
        urls = _replica_urls(args)
        plan = Plan(args.target, rate=args.rate, concurrency=args.concurrency,
                    duration=args.duration, max_requests=args.requests,
                    max_time=args.max_time or ((args.duration + 60) if args.duration else 600.0),
                    request_timeout=args.request_timeout, stream=args.stream,
                    prefix_hash_header=args.prefix_hash_header, replica_urls=tuple(urls),
                    progress_label=args.workload)
    except (ValueError, OSError) as exc:
        print(f"prefix-loadtest run: {exc}", file=sys.stderr)
        return 2
    try:
        result = run(plan, requests, {"name": args.workload, "requests": len(requests),
                                      "seed": args.seed})
    except aiohttp.ClientError as exc:
        print(f"prefix-loadtest run: cannot scrape the replicas: {exc}", file=sys.stderr)
        return 1
    if args.out:
        Path(args.out).write_text(json.dumps(result.to_json(), indent=2) + "\n")
    md = run_markdown(result.summary(), title=f"{args.workload} -> {args.target}")
    if args.markdown:
        Path(args.markdown).write_text(md)
    else:
        print(md)
    return 0
