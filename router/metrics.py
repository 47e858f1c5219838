"""Every router metric, declared once, on a per-app CollectorRegistry (no global state).

Names and labels are the public interface in docs/architecture.md. Label values are bounded:
`replica` comes from membership, `model` from the models the membership serves (a name no
replica lists is `unknown`, see `router.models`; never the client's string), `branch` from the
Branch enum, `status` is the HTTP status code,
`reason`/`state` are fixed vocabularies; routing keys and user ids never become labels. Hot-path
label children are cached in dicts so a proxied request costs a few dict lookups, not a
`labels()` call per metric, and the hot path updates a cached child through its value's own
`inc` (`_adder`, `_observer`): what `Counter.inc`, `Gauge.inc`/`dec` and `Histogram.observe`
do after their argument checks, which the router's own arguments never fail (non-negative
counts, finite durations), with the histogram bucket found by bisection instead of a scan.

`distinct_keys_per_minute` is a HyperLogLog estimate (2^10 registers, ~3% standard error) over a
sliding minute made of six 10-second sub-windows: `observe_key` is O(1); the estimate merges the
live sub-windows (O(6 * 1024)) and is recomputed at most once a second. A sudden rise means a
prompt template started injecting a volatile value (timestamp, request id) before the cacheable
prefix ends.

Multiple uvicorn workers: when PROMETHEUS_MULTIPROC_DIR is set (the CLI sets it for --workers > 1)
prometheus_client keeps values in per-process files and `render()` merges them: counters and
histograms sum; `in_flight`, `connections` and `distinct_keys_per_minute` are summed over live
workers (the key estimate then over-counts keys seen by several workers); `replica_healthy` and
`replicas` take the max over workers.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping

import xxhash
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from router.usage import Usage

__all__ = ["DISAGG_OUTCOMES", "DISAGG_PHASES", "DURATION_BUCKETS", "DistinctKeys", "KV_LAG_BUCKETS", "REPLICA_STATES", "RouterMetrics",
           "TTFB_BUCKETS"]

TTFB_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
REPLICA_STATES = ("healthy", "unhealthy", "draining")
_PEER_KINDS = ("start", "served", "ended", "hello")  # router.peers.state.KINDS
DISAGG_OUTCOMES = ("ok", "no_kv_transfer", "prefill_failed", "decode_failed", "no_decode",
                   "timeout", "client_closed")
DISAGG_PHASES = ("prefill", "transfer_first_token")
KV_LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class DistinctKeys:
    """Sliding-minute HyperLogLog cardinality estimate of routing keys."""

    P = 10
    M = 1 << P
    WINDOWS = 6
    WINDOW_SECONDS = 10.0

    def __init__(self) -> None:
        self._now = time.monotonic
        self._slots: list[bytearray] = [bytearray(self.M) for _ in range(self.WINDOWS)]
        self._slot_epoch: list[int] = [-1] * self.WINDOWS
        # the sub-window `add` writes to, valid for times in [_from, _until)
        self._regs = self._slots[0]
        self._from = self._until = 0.0

    def _slot(self, now: float) -> bytearray:
        epoch = int(now // self.WINDOW_SECONDS)
        i = epoch % self.WINDOWS
        if self._slot_epoch[i] != epoch:
            self._slots[i] = bytearray(self.M)
            self._slot_epoch[i] = epoch
        return self._slots[i]

    def add(self, key: str, now: float | None = None) -> None:
        h = xxhash.xxh64_intdigest(key.encode())
        idx = h >> (64 - self.P)
        rest = h & ((1 << (64 - self.P)) - 1)
        rank = (64 - self.P) - rest.bit_length() + 1
        if now is None:
            now = self._now()
        if self._from <= now < self._until:
            regs = self._regs
        else:
            regs = self._regs = self._slot(now)
            epoch = int(now // self.WINDOW_SECONDS)
            self._from = epoch * self.WINDOW_SECONDS
            self._until = self._from + self.WINDOW_SECONDS
        if regs[idx] < rank:
            regs[idx] = rank

    def estimate(self, now: float | None = None) -> float:
        epoch = int((self._now() if now is None else now) // self.WINDOW_SECONDS)
        live = [s for s, e in zip(self._slots, self._slot_epoch, strict=True)
                if e >= 0 and epoch - e < self.WINDOWS]
        if not live:
            return 0.0
        merged = [max(col) for col in zip(*live, strict=True)] if len(live) > 1 else list(live[0])
        m = self.M
        alpha = 0.7213 / (1 + 1.079 / m)
        raw = alpha * m * m / sum(2.0 ** -r for r in merged)
        zeros = merged.count(0)
        if raw <= 2.5 * m and zeros:
            return m * math.log(m / zeros)
        return raw


Add = Callable[[float], None]
# one finished attempt's updates: in-flight gauge, request counter, TTFB and duration histograms
_Row = tuple[Add, Add, "Add | None", Add]


def _adder(child: Counter | Gauge) -> Add:
    """The ``inc`` of a labelled child's value (prometheus_client's ``ValueClass``: a mutex-held
    float, or the mmap-backed value in multiprocess mode): ``Counter.inc`` / ``Gauge.inc``
    without their checks. Callers pass non-negative counter increments."""
    return child._value.inc  # type: ignore[no-any-return]


def _observer(child: Histogram) -> Add:
    """``Histogram.observe`` of a labelled child without its checks and exemplars: the sum,
    then the first bucket whose upper bound is >= the amount (bisection; the last bound is
    +Inf). Callers pass finite amounts."""
    bounds = tuple(child._upper_bounds)
    buckets = tuple(b.inc for b in child._buckets)
    add_sum = child._sum.inc

    def observe(amount: float) -> None:
        add_sum(amount)
        buckets[bisect_left(bounds, amount)](1)

    return observe


class RouterMetrics:
    def __init__(self) -> None:
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "prefix_router_"
        self.requests = Counter(p + "requests_total", "Proxied requests by replica, routing "
                                "branch, final status code and model",
                                ["replica", "branch", "status", "model"], registry=r)
        self.in_flight = Gauge(p + "in_flight", "Requests this router has open on a replica",
                               ["replica"], registry=r, multiprocess_mode="livesum")
        self.ttfb = Histogram(p + "time_to_first_byte_seconds", "Dispatch to first response "
                              "byte from the replica (the TTFT of a stream)", ["replica", "model"],
                              buckets=TTFB_BUCKETS, registry=r)
        self.duration = Histogram(p + "request_duration_seconds", "Dispatch to end of the "
                                  "relayed response", ["replica"], buckets=DURATION_BUCKETS,
                                  registry=r)
        self.retries = Counter(p + "retries_total", "Attempts moved to the next candidate before "
                               "the first byte, by the replica that failed", ["replica", "reason"],
                               registry=r)
        self.ejections = Counter(p + "ejections_total", "Replicas taken out of rotation",
                                 ["replica", "reason"], registry=r)
        self.healthy = Gauge(p + "replica_healthy", "1 if the replica receives new requests",
                             ["replica"], registry=r, multiprocess_mode="max")
        self.spills = Counter(p + "spills_total", "Requests sent past their home replica because "
                              "it was over the bounded-load cap, by receiving replica and model",
                              ["replica", "model"], registry=r)
        self.distinct = Gauge(p + "distinct_keys_per_minute", "Estimated distinct routing keys "
                              "over the last minute (HyperLogLog)", registry=r,
                              multiprocess_mode="livesum")
        self.rejected = Counter(p + "rejected_total", "Requests answered by the router itself",
                                ["reason"], registry=r)
        self.connections = Gauge(p + "connections", "Client connections this router process has "
                                 "open (refused ones excluded)", registry=r,
                                 multiprocess_mode="livesum")
        self.replicas = Gauge(p + "replicas", "Replicas in membership by state", ["state"],
                              registry=r, multiprocess_mode="max")
        self.scraped = Gauge(p + "replica_scraped_load", "The replica's own load as last "
                             "scraped from its /metrics (the policy's cross-router signal): "
                             "metric=running|waiting|kv_usage", ["replica", "metric"],
                             registry=r, multiprocess_mode="max")
        self.scrape_failures = Counter(p + "scrape_failures_total", "Load scrapes of a "
                                       "replica's /metrics that failed: "
                                       "reason=timeout|connect|status|decode",
                                       ["replica", "reason"], registry=r)
        self.predicted_cached = Counter(
            p + "predicted_cached_tokens", "Prompt tokens the router predicted the serving "
            "replica had cached (prefix index), per served request", ["replica"], registry=r)
        self.reported_cached = Counter(
            p + "reported_cached_tokens", "Prompt tokens the replica reported as cached "
            "(usage.prompt_tokens_details.cached_tokens)", ["replica"], registry=r)
        self.reported_prompt = Counter(
            p + "reported_prompt_tokens", "Prompt tokens of the responses that reported cached "
            "tokens (usage.prompt_tokens)", ["replica"], registry=r)
        self.held = Histogram(
            p + "hold_seconds", "Requests held before dispatch while an earlier request of "
            "this router prefilled their prefix on the chosen replica (routing.hold_tokens), "
            "by replica and outcome=answered|timeout", ["replica", "outcome"],
            buckets=TTFB_BUCKETS, registry=r)
        # prefix-router epp (router/epp): the EPP's own work per decision
        self.epp_decision = Histogram(
            p + "epp_decision_seconds", "Endpoint picker: from the complete request (headers "
            "and body collected) to the answer naming the endpoints - validation, the routing "
            "decision and any hold - by outcome=picked|rejected", ["outcome"],
            buckets=KV_LAG_BUCKETS, registry=r)
        # prefill/decode disaggregation (router.disagg): outcome is DISAGG_OUTCOMES, phase
        # DISAGG_PHASES
        self.disagg_requests = Counter(
            p + "disagg_requests_total", "Requests served in two phases (prefill instance, "
            "then decode instance), by outcome=" + "|".join(DISAGG_OUTCOMES), ["outcome"],
            registry=r)
        self.disagg_phase = Histogram(
            p + "disagg_phase_seconds", "The phases of a disaggregated request's time to first "
            "token, by replica: phase=prefill (dispatch to the prefill instance's answer) and "
            "phase=transfer_first_token (dispatch to the decode instance's first body byte: "
            "the KV transfer and the first decode step)", ["phase", "replica"],
            buckets=TTFB_BUCKETS, registry=r)
        self.disagg_ttfb = Histogram(
            p + "disagg_time_to_first_byte_seconds", "A disaggregated request's first prefill "
            "dispatch to its first decode body byte: the client's TTFT at the router, both "
            "phases and prefill retries included", buckets=TTFB_BUCKETS, registry=r)
        # routing.kv_events (router/kv_events): replica labels come from membership; type is
        # the event type, reason / outcome fixed vocabularies (router.kv_events.subscriber)
        self.kv_events = Counter(p + "kv_events_total", "KV-cache events applied to the precise "
                                 "index, by replica and type=BlockStored|BlockRemoved|"
                                 "AllBlocksCleared", ["replica", "type"], registry=r)
        self.kv_lag = Histogram(p + "kv_event_lag_seconds", "From an event batch's timestamp "
                                "(the replica's clock) to its application in the index",
                                buckets=KV_LAG_BUCKETS, registry=r)
        self.kv_index_blocks = Gauge(p + "kv_index_blocks", "Blocks the precise index holds "
                                     "for the replica (its prefix cache, as its events report)",
                                     ["replica"], registry=r, multiprocess_mode="max")
        self.kv_replica_precise = Gauge(p + "kv_replica_precise", "1 while the replica's "
                                        "event stream is live (precise routing), 0 while it "
                                        "falls back to the approximate index", ["replica"],
                                        registry=r, multiprocess_mode="min")
        self.kv_resyncs = Counter(p + "kv_resyncs_total", "Resyncs of a replica's event "
                                  "stream, by reason=connect|reconnect|gap|malformed|ejected|"
                                  "error and outcome=continued|replayed|partial|no_replay|failed",
                                  ["replica", "reason", "outcome"], registry=r)
        self.kv_drops = Counter(p + "kv_dropped_replicas_total", "Times a replica's entries "
                                  "were dropped from the precise index rather than kept stale, "
                                  "by reason", ["replica", "reason"], registry=r)
        # routing.peers (router/peers): type is one of router.peers.state.KINDS
        self.peer_sent = Counter(p + "peer_events_sent_total", "Events this router process "
                                 "published to its peers, by type=start|served|ended|hello",
                                 ["type"], registry=r)
        self.peer_received = Counter(p + "peer_events_received_total", "Peer events received "
                                     "and decoded, by type and applied=true|false (false: a "
                                     "duplicate, an attempt never seen or expired, an unknown "
                                     "replica)", ["type", "applied"], registry=r)
        self.peer_decode_errors = Counter(p + "peer_decode_errors_total", "Peer messages "
                                          "dropped because they did not decode", registry=r)
        self.peer_connected = Gauge(p + "peer_connected", "Peers heard from within "
                                    "routing.peers.timeout", registry=r,
                                    multiprocess_mode="max")
        self.peer_attempts = Gauge(p + "peer_attempts_open", "Peer attempts mirrored into "
                                   "this process's routing state and not ended yet", registry=r,
                                   multiprocess_mode="livesum")
        self.peer_expired = Counter(p + "peer_attempts_expired_total", "Mirrored attempts "
                                    "ended by their TTL or by their peer's silence", registry=r)
        self.peer_lag = Histogram(p + "peer_mirror_lag_seconds", "From a peer event's "
                                  "publication (the peer's wall clock) to its application here",
                                  buckets=KV_LAG_BUCKETS, registry=r)
        self._peer_sent = {k: self.peer_sent.labels(k) for k in _PEER_KINDS}
        self._peer_received = {(k, a): self.peer_received.labels(k, a)
                               for k in _PEER_KINDS for a in ("true", "false")}
        self._kv_types: dict[tuple[str, str], Counter] = {}
        self._cached: dict[str, tuple[Add, Add, Add]] = {}
        self._keys = DistinctKeys()
        self._keys_refreshed = 0.0
        self._known: set[str] = set()
        # (replica, branch, status, model) -> in-flight gauge, request counter, TTFB and
        # duration histograms of one finished attempt
        self._req: dict[tuple[str, str, int, str], _Row] = {}
        self._inflight: dict[str, Gauge] = {}
        self._inflight_add: dict[str, Add] = {}
        self._ttfb: dict[tuple[str, str], Add] = {}
        self._dur: dict[str, Add] = {}

    # hot path -------------------------------------------------------------------------------

    def dispatched(self, replica: str) -> None:
        add = self._inflight_add.get(replica)
        if add is None:
            g = self._inflight[replica] = self.in_flight.labels(replica)
            add = self._inflight_add[replica] = _adder(g)
        add(1)

    def finished(self, replica: str, branch: str, status: int, ttfb: float | None,
                 duration: float, model: str = "unknown") -> None:
        key = (replica, branch, status, model)
        row = self._req.get(key)
        if row is None:
            row = self._req[key] = self._row(key)
        gauge, count, first_byte, dur = row
        gauge(-1)
        count(1)
        if ttfb is not None:
            if first_byte is None:  # created on the first observation, as the series appears
                first_byte = self._ttfb_child(replica, model)
                self._req[key] = (gauge, count, first_byte, dur)
            first_byte(ttfb)
        dur(duration)

    def _row(self, key: tuple[str, str, int, str]) -> _Row:
        """The children one finished attempt with these labels updates (one lookup per
        attempt); the time-to-first-byte child only once that series exists."""
        replica, branch, status, model = key
        d = self._dur.get(replica)
        if d is None:
            d = self._dur[replica] = _observer(self.duration.labels(replica))
        return (self._inflight_add[replica],
                _adder(self.requests.labels(replica, branch, str(status), model)),
                self._ttfb.get((replica, model)), d)

    def _ttfb_child(self, replica: str, model: str) -> Add:
        h = self._ttfb.get((replica, model))
        if h is None:
            h = self._ttfb[(replica, model)] = _observer(self.ttfb.labels(replica, model))
        return h

    def cached_tokens(self, replica: str, predicted: int, usage: Usage | None) -> None:
        """One served request: the cached tokens predicted for ``replica`` and, when its
        response carried them, the cached and prompt tokens it reported."""
        c = self._cached.get(replica)
        if c is None:
            c = self._cached[replica] = (_adder(self.predicted_cached.labels(replica)),
                                         _adder(self.reported_cached.labels(replica)),
                                         _adder(self.reported_prompt.labels(replica)))
        if predicted:
            c[0](predicted)
        if usage is not None and usage.cached_tokens is not None:
            c[1](usage.cached_tokens)
            if usage.prompt_tokens is not None:
                c[2](usage.prompt_tokens)

    def observe_key(self, key: str) -> None:
        now = time.monotonic()
        self._keys.add(key, now)
        if now - self._keys_refreshed >= 1.0:
            self._keys_refreshed = now
            self.distinct.set(self._keys.estimate(now))

    # rare events -----------------------------------------------------------------------------

    def retry(self, replica: str, reason: str) -> None:
        self.retries.labels(replica, reason).inc()

    def ejection(self, replica: str, reason: str) -> None:
        self.ejections.labels(replica, reason).inc()

    def spill(self, replica: str, model: str = "unknown") -> None:
        self.spills.labels(replica, model).inc()

    def hold(self, replica: str, outcome: str, seconds: float) -> None:
        self.held.labels(replica, outcome).observe(seconds)

    def epp_decided(self, outcome: str, seconds: float) -> None:
        self.epp_decision.labels(outcome).observe(seconds)
    def disagg(self, outcome: str) -> None:
        """One disaggregated request ended with ``outcome`` (`DISAGG_OUTCOMES`)."""
        self.disagg_requests.labels(outcome).inc()

    def disagg_phase_time(self, phase: str, replica: str, seconds: float) -> None:
        self.disagg_phase.labels(phase, replica).observe(seconds)

    def disagg_first_byte(self, seconds: float) -> None:
        self.disagg_ttfb.observe(seconds)

    def kv_batch(self, replica: str, batch: object, lag: float, blocks: int) -> None:
        """One applied event batch of ``replica`` (`router.kv_events.wire.EventBatch`)."""
        counters = self._kv_types
        for event in batch.events:  # type: ignore[attr-defined]
            key = (replica, type(event).__name__)
            c = counters.get(key)
            if c is None:
                c = counters[key] = self.kv_events.labels(*key)
            c.inc()
        self.kv_lag.observe(max(0.0, lag))
        self.kv_index_blocks.labels(replica).set(blocks)

    def kv_blocks(self, replica: str, blocks: int) -> None:
        self.kv_index_blocks.labels(replica).set(blocks)

    def kv_precise(self, replica: str, live: bool) -> None:
        self.kv_replica_precise.labels(replica).set(1 if live else 0)

    def kv_resync(self, replica: str, reason: str, outcome: str) -> None:
        self.kv_resyncs.labels(replica, reason, outcome).inc()

    def kv_dropped(self, replica: str, reason: str, blocks: int) -> None:
        """``replica``'s entries were dropped (counted only when there were any)."""
        if blocks:
            self.kv_drops.labels(replica, reason).inc()

    def kv_forget(self, replica: str) -> None:
        """``replica`` left the membership: drop its gauges."""
        for family in (self.kv_index_blocks, self.kv_replica_precise):
            with contextlib.suppress(KeyError):
                family.remove(replica)
        self._kv_types = {k: v for k, v in self._kv_types.items() if k[0] != replica}

    def peer_event_sent(self, kind: str) -> None:
        self._peer_sent[kind].inc()

    def peer_event_received(self, kind: str, applied: bool, lag: float) -> None:
        self._peer_received[kind, "true" if applied else "false"].inc()
        self.peer_lag.observe(max(0.0, lag))

    def peer_status(self, connected: int, open_attempts: int, expired: int) -> None:
        """The heartbeat's view: live peers, mirrored attempts open, newly expired ones."""
        self.peer_connected.set(connected)
        self.peer_attempts.set(open_attempts)
        if expired:
            self.peer_expired.inc(expired)

    def scraped_load(self, replica: str, running: float, waiting: float, kv_usage: float) -> None:
        self.scraped.labels(replica, "running").set(running)
        self.scraped.labels(replica, "waiting").set(waiting)
        self.scraped.labels(replica, "kv_usage").set(kv_usage)

    def scrape_failed(self, replica: str, reason: str) -> None:
        self.scrape_failures.labels(replica, reason).inc()

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason).inc()

    def set_membership(self, health: Mapping[str, tuple[bool, bool]]) -> None:
        """health: name -> (healthy, draining); drops label sets of departed replicas."""
        counts = dict.fromkeys(REPLICA_STATES, 0)
        self._known.update(health)
        for name, (healthy, draining) in health.items():
            self.healthy.labels(name).set(1 if healthy and not draining else 0)
            counts["draining" if draining else "healthy" if healthy else "unhealthy"] += 1
        for state, n in counts.items():
            self.replicas.labels(state).set(n)
        for name in [n for n in self._known if n not in health]:
            g = self._inflight.get(name)
            # keep a departed replica's series while requests on it are still open
            if g is None or g._value.get() == 0:
                self._known.discard(name)
                self._inflight.pop(name, None)
                self._inflight_add.pop(name, None)
                self._req = {k: v for k, v in self._req.items() if k[0] != name}
                self._ttfb = {k: v for k, v in self._ttfb.items() if k[0] != name}
                self._dur.pop(name, None)
                self._cached.pop(name, None)
                for family in (self.in_flight, self.healthy):
                    with contextlib.suppress(KeyError):
                        family.remove(name)
                for metric in ("running", "waiting", "kv_usage"):
                    with contextlib.suppress(KeyError):
                        self.scraped.remove(name, metric)

    def render(self) -> tuple[bytes, str]:
        now = time.monotonic()
        self._keys_refreshed = now
        self.distinct.set(self._keys.estimate(now))
        if self.multiprocess_dir:
            merged = CollectorRegistry()
            MultiProcessCollector(merged, path=self.multiprocess_dir)
            return generate_latest(merged), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
