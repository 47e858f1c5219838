"""Prometheus metrics of one simulated replica, under vLLM V1's names.

Each replica has its own `CollectorRegistry` (never the global one), so several replicas can
live in one process (tests) without sharing counters. Counters and gauges are read from a
`Snapshot` of the engine at scrape time (no bookkeeping on the hot path); the two latency
histograms are observed by the engine as requests produce their first token and finish.
Every series carries the ``model_name`` label, as vLLM's do - except ``vllm:lora_requests_info``
(exported when the replica serves adapters and has received a request, as vLLM does with
``--enable-lora``: it sets the gauge at engine steps, so a fresh replica has none), whose labels
are ``max_lora``, ``waiting_lora_adapters`` and ``running_lora_adapters`` (comma-joined names)
and whose value is the time the label set was last seen. vLLM sets that gauge with
``set_to_current_time()`` and never removes a label set, so a scrape holds older sets too and
the current state is the series with the largest value; the simulator keeps the last
`LORA_HISTORY` sets to show the same shape at bounded cost.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's bucket boundaries for these two histograms.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(frozen=True)
class Snapshot:
    running: int
    waiting: int
    kv_usage: float
    queries: int
    hits: int
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    finished: int
    aborts: int
    requests: int
    external_queries: int = 0
    external_hits: int = 0
    running_loras: tuple[str, ...] = ()
    waiting_loras: tuple[str, ...] = ()


LORA_HISTORY = 16


@dataclass(frozen=True)
class LoraConfig:
    max_lora: int
    history: OrderedDict[tuple[str, str], float] = field(default_factory=OrderedDict,
                                                         compare=False)

    def observe(self, running: tuple[str, ...], waiting: tuple[str, ...],
                now: float) -> None:
        key = (",".join(waiting), ",".join(running))
        self.history[key] = now
        self.history.move_to_end(key)
        while len(self.history) > LORA_HISTORY:
            self.history.popitem(last=False)


@dataclass(frozen=True)
class CacheConfig:
    block_size: int
    num_gpu_blocks: int
    enable_prefix_caching: bool = True


class _SnapshotCollector(Collector):
    def __init__(self, model: str, snapshot: Callable[[], Snapshot], cache: CacheConfig,
                 lora: LoraConfig | None = None) -> None:
        self._model = model
        self._snapshot = snapshot
        self._cache = cache
        self._lora = lora

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        m = [self._model]

        def gauge(name: str, doc: str, value: float) -> Metric:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(m, value)
            return g

        def counter(name: str, doc: str, value: float) -> Metric:
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric(m, value)
            return c

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                    s.running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                    s.waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                    s.kv_usage)
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of tokens.",
                      s.queries)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of tokens.", s.hits)
        yield counter("vllm:external_prefix_cache_queries", "External prefix cache queries from "
                      "KV connector cross-instance cache sharing, in terms of number of queried "
                      "tokens.", s.external_queries)
        yield counter("vllm:external_prefix_cache_hits", "External prefix cache hits from KV "
                      "connector cross-instance cache sharing, in terms of number of cached "
                      "tokens.", s.external_hits)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.",
                      s.generation_tokens)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                      s.preemptions)
        done = CounterMetricFamily("vllm:request_success", "Count of successfully processed "
                                   "requests.", labels=["model_name", "finished_reason"])
        done.add_metric([self._model, "length"], s.finished)
        yield done
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine "
                                 "CacheConfig", labels=["model_name", "block_size",
                                                        "num_gpu_blocks", "enable_prefix_caching"])
        info.add_metric([self._model, str(self._cache.block_size), str(self._cache.num_gpu_blocks),
                         str(self._cache.enable_prefix_caching)], 1.0)
        yield info
        if self._lora is not None:
            if s.requests:  # vLLM: HELP and TYPE only, no sample, before its first engine step
                self._lora.observe(s.running_loras, s.waiting_loras, time.time())
            lora = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                                     labels=["max_lora", "waiting_lora_adapters",
                                             "running_lora_adapters"])
            for (waiting, running), seen in self._lora.history.items():
                lora.add_metric([str(self._lora.max_lora), waiting, running], seen)
            yield lora
        yield counter("sim:aborts", "Requests aborted because the client went away.", s.aborts)
        yield counter("sim:requests", "Requests received by the simulated replica.", s.requests)


class ReplicaMetrics:
    """The registry of one replica; also the engine's latency `Observer`."""

    def __init__(self, model: str, snapshot: Callable[[], Snapshot], cache: CacheConfig,
                 lora: LoraConfig | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_SnapshotCollector(model, snapshot, cache, lora))
        self._ttft = Histogram("vllm:time_to_first_token_seconds",
                               "Histogram of time to first token in seconds.", ["model_name"],
                               buckets=TTFT_BUCKETS, registry=self.registry).labels(model)
        self._e2e = Histogram("vllm:e2e_request_latency_seconds",
                              "Histogram of e2e request latency in seconds.", ["model_name"],
                              buckets=E2E_BUCKETS, registry=self.registry).labels(model)

    def first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def finished(self, seconds: float, reason: str) -> None:
        self._e2e.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
