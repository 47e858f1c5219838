"""Replica health (active probes + passive ejection) and the vLLM load scrape.

Ejection: a replica is ejected after `health.eject_after` *consecutive* failures, counting both
what the proxy saw (connect error, 5xx, timeout: `record_failure`) and failed active probes
(`GET /health` every `health.interval`). Any success resets the count. An ejected replica is
probed again after its backoff; a successful probe re-admits it, a failed one doubles the backoff
(from `readmit_backoff` up to `readmit_backoff_max`). The backoff level is kept across a quick
re-ejection (flapping) and only resets once the replica stayed admitted for `readmit_backoff_max`.

Models: a probe that succeeded also reads the replica's `GET /v1/models` (with the upstream key)
into `ReplicaState.models`/`parents` (`router.models.served_models`); a failed or malformed
answer keeps the last known list. A list fixed by config or discovery keeps its names and gains
only the adapters whose parent it names. A change calls `on_change`.

Scrape: `GET /metrics` of each replica every `scrape.interval`; `vllm:num_requests_running` and
`vllm:num_requests_waiting` are summed over label sets, `vllm:kv_cache_usage_perc` (or the older
`vllm:gpu_cache_usage_perc`) takes the max over label sets so it stays a fraction, and the labels
`num_gpu_blocks` x `block_size` of `vllm:cache_config_info` give the replica's KV capacity in
tokens (the prefix index's bound for it). A failed scrape (timeout, connection error, non-200,
undecodable body) is counted by reason and never ejects (a replica may run without metrics). It
keeps the last good load while the failed scrape started less than `scrape.stale_after` seconds
after the last good one did (start to start, so a long `health.timeout` does not use up the
window): a replica too busy to answer in time must not look idle. Past that the scraped load
reads 0, so the policy falls back to this router's own in-flight count; the last known capacity
is kept. `ReplicaState.scraped_at` holds that start; it goes with the replica and is cleared
when its URL changes (another process). `vllm:lora_requests_info` (`parse_lora_info`: the
label set with the largest value, i.e. the latest, since vLLM never removes old ones) gives the
adapters running and waiting there and `max_lora`. vLLM sets that gauge at its engine steps
only, so a replica that has served nothing yet exports no sample: "no LoRA information" until
the first scrape after its first request. A scrape that answered without the gauge clears the
LoRA state (a restarted replica has no adapter loaded); a failed scrape keeps the last known
state, like the capacity (one slow scrape under load must not forget where adapters live).

Loops are plain coroutines (`run_probes`, `run_scrapes`) that the app's lifespan starts and
cancels; constructing a HealthMonitor starts nothing. Each tick costs one request per replica,
made concurrently.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from router.metrics import RouterMetrics
from router.models import served_models
from router.settings import HealthSettings, ScrapeSettings

__all__ = [
    "CACHE_CONFIG", "HealthMonitor", "KV_USAGE", "LoraInfo", "RUNNING", "Replica", "Replicas",
    "VllmLoad", "WAITING", "kv_capacity_tokens", "parse_lora_info", "parse_vllm_metrics"
]

log = logging.getLogger("prefix_router.health")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_CONFIG = "vllm:cache_config_info"


class Replica(Protocol):
    name: str
    url: str
    healthy: bool
    draining: bool
    running: float
    waiting: float
    kv_usage: float
    kv_capacity: int
    unstarted: int
    scraped_unstarted: int
    scraped_at: float | None
    models: frozenset[str] | None
    parents: Mapping[str, str]
    fixed_models: frozenset[str] | None
    lora_running: frozenset[str]
    lora_waiting: frozenset[str]
    max_lora: int


class Replicas(Protocol):
    def states(self) -> Iterable[Replica]: ...


@dataclass(frozen=True)
class VllmLoad:
    running: float
    waiting: float
    kv_usage: float
    kv_capacity: int = 0  # tokens: num_gpu_blocks x block_size of cache_config_info; 0 unknown


def _label(labels: str, name: str) -> str | None:
    needle = name + '="'
    at = labels.find(needle)
    while at > 0 and labels[at - 1] not in "{, ":  # the tail of a longer label name
        at = labels.find(needle, at + 1)
    if at < 0:
        return None
    start = at + len(needle)
    end = labels.find('"', start)
    return labels[start:end] if end >= 0 else None


def kv_capacity_tokens(labels: str) -> int:
    """``num_gpu_blocks x block_size`` from the label text of ``vllm:cache_config_info``
    (0 when either is missing or not a positive integer, e.g. vLLM's ``None`` before
    profiling)."""
    blocks, size = _label(labels, "num_gpu_blocks"), _label(labels, "block_size")
    if blocks is None or size is None or not blocks.isdigit() or not size.isdigit():
        return 0
    return int(blocks) * int(size)


def parse_vllm_metrics(text: str) -> VllmLoad:
    """The three load gauges from a Prometheus text exposition (absent gauges read as 0), and
    the KV capacity from ``vllm:cache_config_info``'s labels."""
    running = waiting = kv = 0.0
    capacity = 0
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            rest = line[line.rfind("}") + 1:]
        else:
            name, rest = line[:space], line[space:]
        if name == CACHE_CONFIG and brace != -1:
            capacity = max(capacity, kv_capacity_tokens(line[brace:line.rfind("}") + 1]))
            continue
        if name != RUNNING and name != WAITING and name not in KV_USAGE:
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if value != value:  # NaN
            continue
        if name == RUNNING:
            running += value
        elif name == WAITING:
            waiting += value
        else:
            kv = max(kv, value)
    return VllmLoad(running, waiting, kv, capacity)


@dataclass(frozen=True)
class LoraInfo:
    running: frozenset[str]
    waiting: frozenset[str]
    max_lora: int


_LORA_INFO = "vllm:lora_requests_info"
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _names(value: str) -> frozenset[str]:
    return frozenset(n for n in value.split(",") if n)


def parse_lora_info(text: str) -> LoraInfo | None:
    """The latest ``vllm:lora_requests_info`` label set (largest value); None when absent."""
    if _LORA_INFO not in text:
        return None
    best: tuple[float, dict[str, str]] | None = None
    for line in text.splitlines():
        if not line.startswith(_LORA_INFO + "{"):
            continue
        close = line.rfind("}")
        try:
            value = float(line[close + 1:].split()[0])
        except (IndexError, ValueError):
            continue
        if best is None or value > best[0]:
            best = (value, dict(_LABEL.findall(line[len(_LORA_INFO) + 1:close])))
    if best is None:
        return None
    labels = best[1]
    try:
        max_lora = max(0, int(labels.get("max_lora", "0")))
    except ValueError:
        max_lora = 0
    return LoraInfo(_names(labels.get("running_lora_adapters", "")),
                    _names(labels.get("waiting_lora_adapters", "")), max_lora)


@dataclass
class _Track:
    failures: int = 0
    backoff: float = 0.0
    next_probe: float = 0.0
    admitted_at: float = 0.0


class HealthMonitor:
    def __init__(self, health: HealthSettings, scrape: ScrapeSettings, replicas: Replicas,
                 metrics: RouterMetrics, on_change: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic,
                 models_headers: Mapping[str, str] | None = None) -> None:
        self.health = health
        self.scrape = scrape
        self.replicas = replicas
        self.metrics = metrics
        self.on_change = on_change
        self.clock = clock
        self._timeout = aiohttp.ClientTimeout(total=health.timeout)  # probes and scrapes
        self._track: dict[str, _Track] = {}
        self._models_headers = dict(models_headers or {})

    def _get(self, name: str) -> _Track:
        t = self._track.get(name)
        if t is None:
            t = self._track[name] = _Track(backoff=self.health.readmit_backoff)
        return t

    # passive ---------------------------------------------------------------------------------

    def record_success(self, replica: Replica) -> None:
        t = self._track.get(replica.name)
        if t is not None and t.failures:
            t.failures = 0

    def record_failure(self, replica: Replica, reason: str) -> None:
        t = self._get(replica.name)
        t.failures += 1
        if replica.healthy and t.failures >= self.health.eject_after:
            self.eject(replica, reason)

    def eject(self, replica: Replica, reason: str) -> None:
        t = self._get(replica.name)
        now = self.clock()
        if t.admitted_at and now - t.admitted_at >= self.health.readmit_backoff_max:
            t.backoff = self.health.readmit_backoff
        replica.healthy = False
        t.next_probe = now + t.backoff
        self.metrics.ejection(replica.name, reason)
        log.warning("ejected replica %s (%s); next probe in %.1fs", replica.name, reason, t.backoff)
        self.on_change()

    def _readmit(self, replica: Replica) -> None:
        t = self._get(replica.name)
        replica.healthy = True
        t.failures = 0
        t.admitted_at = self.clock()
        log.info("re-admitted replica %s", replica.name)
        self.on_change()

    def _probe_failed_while_ejected(self, replica: Replica) -> None:
        t = self._get(replica.name)
        t.backoff = min(t.backoff * 2, self.health.readmit_backoff_max)
        t.next_probe = self.clock() + t.backoff

    # active ----------------------------------------------------------------------------------

    def due(self, replica: Replica, now: float) -> bool:
        return now >= self._get(replica.name).next_probe

    async def probe(self, session: aiohttp.ClientSession, replica: Replica) -> bool:
        try:
            async with session.get(replica.url + "/health", allow_redirects=False,
                                   timeout=self._timeout) as r:
                await r.read()
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def learn_models(self, session: aiohttp.ClientSession, replica: Replica) -> bool:
        """Read ``/v1/models`` into the replica's model set; True if it changed."""
        try:
            async with session.get(replica.url + "/v1/models", allow_redirects=False,
                                   headers=self._models_headers, timeout=self._timeout) as r:
                if r.status != 200:
                    return False
                served = served_models(await r.json(content_type=None))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return False
        if served is None:
            return False
        fixed = replica.fixed_models
        names = served.names if fixed is None else fixed | {
            a for a, base in served.parents.items() if base in fixed}
        if names == replica.models and served.parents == replica.parents:
            return False
        replica.models, replica.parents = names, served.parents
        return True

    async def _probe_and_learn(self, session: aiohttp.ClientSession, replica: Replica) -> bool:
        ok = await self.probe(session, replica)
        if ok and await self.learn_models(session, replica):
            log.info("replica %s serves %s", replica.name, ", ".join(sorted(replica.models or ())))
            self.on_change()
        return ok

    async def probe_once(self, session: aiohttp.ClientSession) -> None:
        now = self.clock()
        due = [r for r in self.replicas.states() if self.due(r, now)]
        results = await asyncio.gather(*(self._probe_and_learn(session, r) for r in due))
        now = self.clock()
        for replica, ok in zip(due, results, strict=True):
            t = self._get(replica.name)
            if replica.healthy:
                t.next_probe = now + self.health.interval
                if ok:
                    t.failures = 0
                else:
                    self.record_failure(replica, "probe")
            elif ok:
                self._readmit(replica)
                t.next_probe = now + self.health.interval
            else:
                self._probe_failed_while_ejected(replica)

    async def run_probes(self, session: aiohttp.ClientSession) -> None:
        tick = min(self.health.interval, self.health.readmit_backoff)
        while True:
            try:
                await self.probe_once(session)
            except Exception:  # a bug here must not silently stop health checking
                log.exception("health probe tick failed")
            await asyncio.sleep(tick)

    # scrape ----------------------------------------------------------------------------------

    async def scrape_one(self, session: aiohttp.ClientSession, replica: Replica) -> None:
        started = self.clock()
        text: str | None = None
        failed = "status"
        try:
            async with session.get(replica.url + "/metrics", allow_redirects=False,
                                   timeout=self._timeout) as r:
                if r.status == 200:
                    text = await r.text()
        except TimeoutError:
            failed = "timeout"
        except (aiohttp.ClientError, OSError):
            failed = "connect"
        except UnicodeDecodeError:
            failed = "decode"
        if text is None:
            self.metrics.scrape_failed(replica.name, failed)
            last = replica.scraped_at
            # ages are start to start, so a long health.timeout does not eat the window
            if last is not None and started - last < self.scrape.stale_after:
                return  # the last good load stands (a busy replica is slow to answer, not idle)
            load, lora = VllmLoad(0.0, 0.0, 0.0), None
        else:
            replica.scraped_at = started
            load, lora = parse_vllm_metrics(text), parse_lora_info(text)
        replica.running, replica.waiting = load.running, load.waiting
        if lora is not None:
            replica.lora_running, replica.lora_waiting = lora.running, lora.waiting
            replica.max_lora = lora.max_lora
        elif text is not None:  # no gauge (yet): no LoRA information; a failed scrape keeps the last
            replica.lora_running = replica.lora_waiting = frozenset()
            replica.max_lora = 0
        replica.kv_usage = load.kv_usage
        replica.scraped_unstarted = replica.unstarted
        if load.kv_capacity:  # a failed scrape keeps the last known capacity
            replica.kv_capacity = load.kv_capacity
        self.metrics.scraped_load(replica.name, load.running, load.waiting, load.kv_usage)

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        await asyncio.gather(*(self.scrape_one(session, r) for r in self.replicas.states()))

    async def run_scrapes(self, session: aiohttp.ClientSession) -> None:
        while True:
            try:
                await self.scrape_once(session)
            except Exception:
                log.exception("metrics scrape tick failed")
            await asyncio.sleep(self.scrape.interval)

    def forget(self, names: Iterable[str]) -> None:
        """Drop tracking of replicas that left membership."""
        for name in names:
            self._track.pop(name, None)
