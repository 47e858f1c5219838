"""`prefix-loadtest simulate`: a fleet-scale discrete-event simulation in virtual time.

No HTTP, no sleeping: the simulation runs the **router's own code** (``router.keys.derive``,
``router.replicas.ReplicaSet`` and its ring, ``router.policy``) in front of N copies of **the
simulated replica's own engine** (``loadtest.replica.engine.Engine``: the same continuous-batching
scheduler, the same ``PrefixCache`` block pool, the same ``TimingModel``), driven by a virtual
clock. A policy can therefore be compared at 64+ replicas and very large traces on one core — the
way to plan beyond what one machine can serve.

Event loop: a heap of (time, order, event). An *arrival* derives the routing key, refreshes every
replica's load (its outstanding requests: running + waiting, which is what the router's in-flight
count converges to) and asks the policy for a decision, then submits the request to that replica's
engine and wakes it if idle. A *step end* applies the engine step that was planned at its start
(tokens produced, blocks cached, requests finished), records TTFT/latency, and plans the next step
at once if work remains — exactly what the replica's asyncio loop does, minus the sleep.

Each result carries the one-cache ceiling of its requests (`ceiling`, `SimResult.of_ceiling`):
the same prompts through one cache of the whole fleet's capacity, the best any policy could hit.

Inputs: a Mooncake-format trace (``--trace``: timestamps in ms, input/output lengths, 512-token
block hash ids -> token ids generated per block id, no text) or a named workload
(``--workload``). Cost: O(steps x running batch) Python work; arrivals O(N) for the load refresh.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

import yaml

from loadtest.ceiling import Ceiling, fits, replay
from loadtest.fleet import NAME_PREFIX as FLEET_NAME_PREFIX
from loadtest.replica.engine import Engine, EngineError, EngineLimits, EngineRequest
from loadtest.replica.timing import TimingModel
from loadtest.sglang_model import NAME as SGLANG_MODEL
from loadtest.sglang_model import SglangModel
from loadtest.stats import max_over_mean, summarize
from router.keys import KeyConfig
from router.replicas import ReplicaSet, ReplicaState
from router.routing import Routed, Router
from router.settings import RoutingSettings, Settings
from templates_audit.blocks import block_hashes

PRECISE = "cache_aware+kv"  # cache_aware with the precise index, fed by the engines' pools

__all__ = ["PRECISE", "SimConfig", "SimRequest", "SimResult", "add_arguments", "ceiling", "main",
           "mooncake_requests", "sim_prompts", "simulate"]


@dataclass(frozen=True)
class SimRequest:
    at: float  # arrival, seconds of virtual time
    path: str
    key_body: dict[str, Any]  # what the router derives the key from (may be a prefix window)
    prompt_ids: Sequence[int]
    max_tokens: int
    headers: dict[str, str] = field(default_factory=dict)
    prompt_hashes: Sequence[int] | None = None  # full-block hashes of prompt_ids, if precomputed


@dataclass(frozen=True)
class SimConfig:
    replicas: int = 4
    policy: str = "prefix"
    load_factor: float = 1.25
    load_floor: int = 8  # the router's default (routing.load_floor)
    ring: str = "xxhash"
    block_size: int = 16
    kv_blocks: int | None = 8192
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    prompt_affinity: bool = True  # routing.prompt_affinity (accepted, no effect)
    # router processes, each with its own replica states, in-flight requests and indexes (the
    # precise ones fed by the same engines); arrivals split round-robin between them, as
    # `loadtest.splitter` does
    routers: int = 1
    # routing.peers between those processes: each one's attempts (start / first byte / end)
    # reach every other one this many seconds later, applied by `router.peers.PeerState`
    # (None: no sharing, each process sees only its own requests)
    peer_delay: float | None = None
    peer_ttl: float = 30.0  # routing.peers.ttl
    timing: TimingModel = field(default_factory=TimingModel)
    routing: dict[str, Any] = field(default_factory=dict)  # further routing.* settings
    # replica i is named f"{name_prefix}{i}"; the ring places keys by name, so a replay of a
    # `make bench` cell takes the names its HTTP fleet has (`loadtest.fleet`: sim-0, sim-1, ...)
    name_prefix: str = "r"

    def routing_settings(self) -> RoutingSettings:
        """The validated ``routing:`` section this run routes with (as the app would)."""
        return Settings.from_dict({"routing": {
            **self.routing, "policy": self.policy, "ring": self.ring,
            "load_factor": self.load_factor, "load_floor": self.load_floor,
            "prompt_affinity": self.prompt_affinity}}).routing


@dataclass
class SimResult:
    config: dict[str, Any]
    requests: int
    virtual_seconds: float
    wall_seconds: float
    hit_rate: float
    ttft: dict[str, float]
    e2e: dict[str, float]
    per_replica_requests: dict[str, int]
    load_max_over_mean: float
    branches: dict[str, int]
    preemptions: int
    ceiling: dict[str, Any] = field(default_factory=dict)  # `ceiling(requests, config)`
    rejected: int = 0  # requests longer than a replica's KV pool (a replica answers 400)
    holds: int = 0  # requests held until an earlier one's prefill of their prefix answered
    # prompt tokens by why they were or were not a hit (`_Attribution`)
    misses: dict[str, int] = field(default_factory=dict)
    peer_events: int = 0  # routing.peers events applied (`SimConfig.peer_delay`)

    @property
    def of_ceiling(self) -> float:
        """This run's hit rate over the one-cache ceiling's."""
        c = self.ceiling.get("hit_rate")
        return self.hit_rate / c if c else float("nan")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _hashes(req: SimRequest, block_size: int) -> Sequence[int]:
    hashes = req.prompt_hashes
    if hashes is not None and len(hashes) * block_size <= len(req.prompt_ids):
        return hashes
    return block_hashes(req.prompt_ids, block_size)  # none, or precomputed for another size


def ceiling(requests: Sequence[SimRequest], config: SimConfig) -> Ceiling:
    """The one-cache ceiling of ``requests`` on ``config``'s fleet (`loadtest.ceiling`): one
    cache of ``replicas x kv_blocks`` blocks, arrival order; requests one replica would refuse
    are left out, as the simulation drops them."""
    bs, kv = config.block_size, config.kv_blocks
    return replay(sim_prompts(requests, bs, kv), None if kv is None else kv * config.replicas, bs)


def sim_prompts(requests: Sequence[SimRequest], block_size: int = 16,
                kv_blocks: int | None = None) -> Iterator[tuple[Sequence[int], int]]:
    """(full-block hashes, prompt tokens) of ``requests`` in arrival order, those one replica
    of ``kv_blocks`` admits (`loadtest.ceiling.request_prompts` for simulated requests)."""
    for r in sorted(requests, key=lambda r: r.at):
        if fits(len(r.prompt_ids), r.max_tokens, kv_blocks, block_size):
            yield _hashes(r, block_size), len(r.prompt_ids)


def simulate(requests: Sequence[SimRequest], config: SimConfig) -> SimResult:
    names = [f"{config.name_prefix}{i}" for i in range(config.replicas)]
    limits = EngineLimits(block_size=config.block_size, kv_blocks=config.kv_blocks,
                          max_num_seqs=config.max_num_seqs,
                          max_num_batched_tokens=config.max_num_batched_tokens,
                          max_model_len=1 << 30)
    clock = [0.0]  # the virtual clock every engine reads arrival times from
    engines = {n: Engine(limits, config.timing, clock=lambda: clock[0]) for n in names}
    from router.discovery.base import Endpoint

    current: list[SimRequest] = []  # the arrival being routed (precise routing's keys)
    # the app's routing entry point per router process (or the model of sglang-router's policy)
    routers: list[Router | SglangModel] = []
    all_states: list[dict[str, ReplicaState]] = []
    hold_timeout = 0.0
    for _ in range(max(1, config.routers)):
        rset = ReplicaSet(ring_kind=config.ring)
        rset.update_membership([Endpoint(name=n, url=f"sim://{n}") for n in names])
        router: Router | SglangModel
        if config.policy == SGLANG_MODEL:
            router = SglangModel(rset)
        elif config.policy == PRECISE:
            router = _precise_router(config, rset, engines, current, lambda: clock[0])
            hold_timeout = router.settings.hold_timeout
        else:
            router = Router(config.routing_settings(), rset)
            hold_timeout = router.settings.hold_timeout
        routers.append(router)
        all_states.append({s.name: s for s in rset.states()})
    peer_states: list[Any] = []
    if config.peer_delay is not None and len(routers) > 1 and config.policy != SGLANG_MODEL:
        from router.peers import Outbox, PeerState

        def deliver(src: int, event: Any) -> None:
            assert config.peer_delay is not None
            for j in range(len(routers)):
                if j != src:
                    heapq.heappush(heap, (clock[0] + config.peer_delay, next(order), "peer",
                                          (j, event)))

        for i, router in enumerate(routers):
            assert isinstance(router, Router)
            router.outbox = Outbox(f"p{i}", partial(deliver, i), clock=lambda: clock[0])
            # a silent peer never times out here: every process routes until the end
            peer_states.append(PeerState(router, config.peer_ttl, float("inf"),
                                         clock=lambda: clock[0], me=f"p{i}"))
    why = _Attribution()
    capacity = (config.kv_blocks or 0) * config.block_size  # what cache_config_info reports
    by_rid: dict[int, dict[str, ReplicaState]] = {}  # the states of the router that routed it

    heap: list[tuple[float, int, str, Any]] = []
    order = itertools.count()
    for r in requests:
        heapq.heappush(heap, (r.at, next(order), "arrive", r))
    busy: dict[str, bool] = dict.fromkeys(names, False)
    routed: dict[int, Routed] = {}
    arrivals: dict[int, float] = {}
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    per_replica: dict[str, int] = dict.fromkeys(names, 0)
    branches: dict[str, int] = {}
    seq_counter = itertools.count()
    rids = itertools.count()
    pending: dict[int, tuple[SimRequest, Routed, float]] = {}  # routed, not dispatched yet
    arrived_n = itertools.count()
    holds = 0
    rejected = 0
    now = 0.0
    wall0 = time.perf_counter()

    def dispatch_now(rid: int) -> None:
        heapq.heappush(heap, (clock[0], next(order), "submit", rid))

    def start_step(name: str, t: float) -> None:
        eng = engines[name]
        plan = eng.schedule()
        if not plan.chunks:
            busy[name] = False
            return
        busy[name] = True
        eng.stats.steps += 1
        dur = config.timing.step_seconds(plan.prefill_tokens, plan.decoding)
        heapq.heappush(heap, (t + dur, next(order), "step", (name, plan)))

    while heap:
        now, _, kind, payload = heapq.heappop(heap)
        clock[0] = now
        if kind == "arrive":
            req: SimRequest = payload
            which = next(arrived_n) % len(routers)
            router, states = routers[which], all_states[which]
            for n in names:  # a fresh scrape of every replica
                e, st = engines[n], states[n]
                st.running, st.waiting = len(e.running), len(e.waiting)
                st.kv_usage, st.kv_capacity = e.kv_usage, capacity
                st.scraped_unstarted = st.unstarted
            current[:] = [req]
            r_ = router.route(req.path, req.headers, req.key_body, next(seq_counter))
            if r_ is None:
                continue
            decision = r_.decision
            branches[str(decision.branch)] = branches.get(str(decision.branch), 0) + 1
            per_replica[decision.replica] += 1
            rid = next(rids)
            pending[rid] = (req, r_, now)
            by_rid[rid] = states
            leader = r_.leader
            if leader is not None and leader.when_answered(partial(dispatch_now, rid)):
                # held until the leader answers (the app's `_hold`), at most hold_timeout
                holds += 1
                heapq.heappush(heap, (now + hold_timeout, next(order), "submit", rid))
            else:
                heapq.heappush(heap, (now, next(order), "submit", rid))
        elif kind == "peer":
            j, event = payload
            peer_states[j].apply(event)
        elif kind == "submit":
            rid = payload
            if rid not in pending:
                continue  # already dispatched (its leader answered before the timeout)
            req, r_, arrived = pending.pop(rid)
            states = by_rid[rid]
            name = r_.decision.replica
            eng = engines[name]
            try:
                eng.submit(EngineRequest(request_id=str(rid), prompt_ids=req.prompt_ids,
                                         max_tokens=req.max_tokens,
                                         prompt_hashes=_hashes(req, config.block_size)))
            except EngineError:  # too long for the replica: it answers 400, counts nothing
                rejected += 1
                continue
            arrivals[rid] = arrived
            routed[rid] = r_
            why.dispatched(rid, name, engines, req, config.block_size)
            states[name].in_flight += 1  # what the proxy does around an attempt
            r_.started(states[name])
            if not busy[name]:
                start_step(name, now)
        else:
            name, plan = payload
            engines[name].apply(plan, now)
            for seq, _n in plan.chunks:
                rid = int(seq.req.request_id)
                states = by_rid[rid]
                if seq.generated >= 1 and rid not in first:
                    first[rid] = now
                    why.answered(rid, seq.cached_tokens)
                    routed[rid].served(states[name], 200)
                if seq.done and rid not in done:
                    done[rid] = now
                    routed[rid].ended(states[name])
                    states[name].in_flight -= 1
            start_step(name, now)

    hits = sum(e.stats.hits for e in engines.values())
    queries = sum(e.stats.queries for e in engines.values())
    ttft = [first[r] - arrivals[r] for r in first]
    e2e = [done[r] - arrivals[r] for r in done]
    cfg = asdict(config)
    cfg["timing"] = asdict(config.timing)
    return SimResult(
        config=cfg,
        requests=len(arrivals),
        holds=holds,
        virtual_seconds=now,
        wall_seconds=time.perf_counter() - wall0,
        hit_rate=hits / queries if queries else 0.0,
        ttft=summarize(ttft),
        e2e=summarize(e2e),
        per_replica_requests=per_replica,
        load_max_over_mean=max_over_mean(per_replica.values()),
        branches=branches,
        preemptions=sum(e.stats.preemptions for e in engines.values()),
        ceiling=ceiling(requests, config).to_json(),
        rejected=rejected,
        misses=why.totals,
        peer_events=sum(p.applied for p in peer_states),
    )


def _precise_router(config: SimConfig, rset: ReplicaSet, engines: dict[str, Engine],
                    current: list[SimRequest], now: Callable[[], float]) -> Router:
    """``cache_aware`` with the precise index (`router.kv_events`) fed by every engine's block
    pool as it changes - KV events that arrive at once, none lost. The engines chain the
    router's own block hash over the same token ids, so an engine hash is its router key; a
    request's exact keys are its prompt's full-block hashes, up to the last token."""
    from router.chunks import Chunks
    from router.kv_events.index import KvIndex, PreciseIndex
    from router.kv_events.wire import BlockRemoved
    from router.prefix_index import ApproxIndex

    settings = replace(config, policy="cache_aware").routing_settings()
    precise = PreciseIndex(settings.kv_events.speculative_ttl, now)
    index = KvIndex(ApproxIndex(settings.kv_capacity_tokens, settings.index_max_entries),
                    precise)
    bs = config.block_size
    for name, eng in engines.items():
        precise.set_live(name, True)
        # chained: every router process's index hears every engine
        stored, evicted = eng.cache.on_store, eng.cache.on_evict

        def on_store(hashes: Any, name: str = name, then: Any = stored) -> None:
            if then is not None:
                then(hashes)
            precise.store(name, hashes, hashes, bs)

        def on_evict(hashes: Any, name: str = name, then: Any = evicted) -> None:
            if then is not None:
                then(hashes)
            precise.apply(name, BlockRemoved(block_hashes=list(hashes)))

        eng.cache.on_store, eng.cache.on_evict = on_store, on_evict

    def exact(path: str, body: Any, pool: Any) -> Chunks:
        req = current[0]
        n = len(req.prompt_ids)
        usable = max(0, (n - 1) // bs)
        return Chunks(tuple(_hashes(req, bs)[:usable]),
                      tuple(range(bs, (usable + 1) * bs, bs)), n)

    return Router(settings, rset, index, exact)


class _Attribution:
    """Each request's prompt tokens split by cause, from the engines' true caches.

    At dispatch: ``here`` = tokens the chosen replica holds, ``best`` = the most any replica
    holds. At admission the engine reports the real hit ``hit``. Then ``hit`` (cached),
    ``here - hit`` (evicted or not yet cached while queued: ``lost_queued``), ``best - here``
    (a longer prefix sat on another replica: ``elsewhere``), ``prompt - max(best, hit)``
    (cached nowhere in the fleet: ``cold``). Cost: O(replicas x blocks) per request.
    """

    def __init__(self) -> None:
        self.totals: dict[str, int] = dict.fromkeys(("hit", "cold", "elsewhere", "lost_queued"), 0)
        self._open: dict[int, tuple[int, int, int]] = {}

    def dispatched(self, rid: int, name: str, engines: dict[str, Engine], req: SimRequest,
                   block_size: int) -> None:
        hashes, n = _hashes(req, block_size), len(req.prompt_ids)
        held = {k: e.cache.cached_prefix_tokens(hashes, n) for k, e in engines.items()}
        self._open[rid] = (n, held[name], max(held.values()))

    def answered(self, rid: int, hit: int) -> None:
        got = self._open.pop(rid, None)
        if got is None:
            return
        n, here, best = got
        t = self.totals
        t["hit"] += hit
        t["lost_queued"] += max(0, here - hit)
        t["elsewhere"] += max(0, best - max(here, hit))
        t["cold"] += max(0, n - max(best, hit))


# -- inputs -----------------------------------------------------------------------------------

_BLOCK = 512
_KEY_TEXT_LIMIT = KeyConfig.max_prefix_chars  # as far as the router reads a prompt


def _block_ids(block_id: int, cache: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
    ids = cache.get(block_id)
    if ids is None:
        # distinct per (block, position); the content is irrelevant beyond identity because
        # the block hashes are chained from the trace's ids
        base = (block_id * 2_654_435_761) & 0x7FFFFFFF
        ids = tuple((base + j * 40_503) & 0x7FFFFFFF for j in range(_BLOCK))
        cache[block_id] = ids
    return ids


def _block_hashes_of(hids: Sequence[int], cache: dict[int, tuple[int, ...]],
                     hcache: dict[int, list[int]], block_size: int) -> list[int]:
    """Chained 16-token hashes of whole 512-token trace blocks, memoised per trace block id.

    Valid because trace ids are chained (an id always follows the same predecessor), so a
    block's hashes depend on its id alone; each distinct block is hashed once.
    """
    out: list[int] = []
    parent: int | None = None
    for hid in hids:
        hs = hcache.get(hid)
        if hs is None:
            hs = block_hashes(_block_ids(hid, cache), block_size, parent=parent)
            hcache[hid] = hs
        out.extend(hs)
        parent = hs[-1] if hs else parent
    return out


def mooncake_requests(
    path: str,
    limit: int | None = None,
    time_scale: float = 1.0,
    max_output_tokens: int = 64,
    repeat: int = 1,
    block_size: int = 16,
) -> Iterator[SimRequest]:
    """Mooncake records -> simulated requests; token ids per 512-token block id, no text.

    ``repeat`` > 1 replays the trace again after its end with block ids offset (a different
    population with the same structure), to build traces larger than the file.
    """
    from loadtest.workloads import mooncake_block_text, mooncake_records

    cache: dict[int, tuple[int, ...]] = {}
    hcache: dict[int, list[int]] = {}
    window: dict[int, str] = {}
    recs = list(mooncake_records(path))
    span = (recs[-1].timestamp + 1) if recs else 0
    n = 0
    for rep in range(repeat):
        offset = rep * 10_000_000
        for rec in recs:
            if limit is not None and n >= limit:
                return
            hids = [h + offset if h != 0 else 0 for h in rec.hash_ids]
            ids: list[int] = []
            for hid in hids:
                ids.extend(_block_ids(hid, cache))
            n_tokens = rec.input_length
            ids = ids[:n_tokens]
            hashes = None
            if _BLOCK % block_size == 0:
                hashes = _block_hashes_of(hids, cache, hcache, block_size)[: n_tokens // block_size]
            # the prompt text the router hashes: the whole blocks (a partial last block only
            # adds a partial key chunk), as far as the router reads (max_prefix_chars)
            full = n_tokens // _BLOCK
            parts, size = [], 0
            for hid in hids[: max(full, 1)]:
                if size >= _KEY_TEXT_LIMIT:
                    break
                if hid not in window:
                    window[hid] = mooncake_block_text(hid)
                parts.append(window[hid])
                size += len(window[hid])
            prompt = "".join(parts) if full else parts[0][:2048]
            yield SimRequest(
                at=(rec.timestamp + rep * span) / 1000.0 / time_scale,
                path="/v1/completions",
                key_body={"model": "sim-model", "prompt": prompt, "stream": True},
                prompt_ids=ids,
                max_tokens=max(1, min(rec.output_length, max_output_tokens)),
                prompt_hashes=hashes,
            )
            n += 1


def workload_requests(name: str, requests: int, seed: int, rate: float, **kw: Any) -> list[SimRequest]:
    """A named workload (``loadtest.workloads``) rendered and tokenised like the replica does."""
    from loadtest.workloads import WorkloadSpec, generate

    # streamed, as the simulation answers: a response starts with its first token
    return _sim_requests(generate(WorkloadSpec(name, requests=requests, seed=seed, rate=rate,
                                               stream=True, **kw)))


def bench_cell(name: str, replicas: int, seed: int = 0) -> tuple[list[SimRequest], SimConfig]:
    """The requests and fleet of one `make bench` compare cell (`loadtest.cells.WORKLOADS` at
    ``replicas``), replayed open-loop at the bench rate: the same prompts, arrival order and
    replica sizes as the HTTP run, in virtual time (no client or proxy latency)."""
    import tempfile
    from pathlib import Path

    from loadtest.cells import WORKLOADS, cell_requests
    from loadtest.runner import scale_arrivals

    chosen = [w for w in WORKLOADS if w.name == name]
    if not chosen:
        raise ValueError(f"no bench workload {name!r} (one of {', '.join(w.name for w in WORKLOADS)})")
    w = chosen[0].at(replicas)
    with tempfile.TemporaryDirectory(prefix="simcell-") as tmp:
        reqs, _meta = cell_requests(w, seed, Path(tmp))
    f = w.fleet
    timing = TimingModel(step_ms=f.step_ms, prefill_us_per_token=f.prefill_us_per_token,
                         decode_us_per_seq=f.decode_us_per_seq, speed=f.speed)
    cfg = SimConfig(replicas=replicas, block_size=f.block_size, kv_blocks=f.kv_blocks,
                    max_num_seqs=f.max_num_seqs, timing=timing, name_prefix=FLEET_NAME_PREFIX)
    return _sim_requests(scale_arrivals(reqs, w.rate)), cfg


def _sim_requests(reqs: Any) -> list[SimRequest]:
    from templates_audit.render import ChatRenderer
    from templates_audit.tokenize import default_tokenizer

    tok = default_tokenizer()
    renderer = ChatRenderer()
    out = []
    for r in reqs:
        if "messages" in r.body:
            text = renderer.render(r.body["messages"], r.body.get("tools"))
        else:
            text = str(r.body.get("prompt", ""))
        out.append(SimRequest(at=r.at, path=r.path, key_body=r.body, prompt_ids=tok.encode(text),
                              max_tokens=int(r.body.get("max_tokens", 16))))
    return out


# -- CLI ----------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="Mooncake-format JSONL (timestamp ms, input_length, output_length, hash_ids)")
    src.add_argument("--workload", help="a named workload: shared-prefix, multi-turn, hot-prefix, volatile, rag, agent")
    src.add_argument("--bench-cell", help="a `make bench` compare workload (shared-prefix, hot-prefix, "
                     "multi-turn, mooncake, rag, agent) at --replicas, with its fleet and rate")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--policy", action="append", default=None,
                   help="cache_aware | cache_aware+kv (precise routing, events with no delay) | "
                        "prefix | round_robin | least_loaded | sglang_model "
                        "(a model of sglang-router's cache_aware; repeatable: compare several)")
    p.add_argument("--requests", type=int, default=None, help="cap on requests (default: whole trace / 1000)")
    p.add_argument("--repeat", type=int, default=1, help="replay the trace N times (larger populations)")
    p.add_argument("--time-scale", type=float, default=1.0, help="trace seconds per simulated second (>1 = faster arrivals)")
    p.add_argument("--rate", type=float, default=20.0, help="workload arrival rate (req/s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-output-tokens", type=int, default=64)
    p.add_argument("--load-factor", type=float, default=1.25)
    p.add_argument("--load-floor", type=int, default=8, help="routing.load_floor (0 = pure bounded loads)")
    p.add_argument("--no-prompt-affinity", dest="prompt_affinity", action="store_false",
                   help="routing.prompt_affinity: false (accepted; no effect since the "
                        "cache_aware policy replaced the affinities)")
    p.add_argument("--routers", type=int, default=1,
                   help="router processes, arrivals split round-robin between them (each its "
                        "own load view and indexes)")
    p.add_argument("--peer-delay", type=float, default=None, metavar="SECONDS",
                   help="routing.peers between the --routers processes: each one's attempts "
                        "reach the others after this delay (default: no sharing)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-blocks", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--routing", action="append", default=[], metavar="KEY=VALUE",
                   help="a further routing.* setting (YAML value), e.g. decode_tokens=16")
    p.add_argument("--json", dest="json_out", help="write results as JSON to this file")


def main(args: argparse.Namespace) -> int:
    if args.replicas < 1:
        print("prefix-loadtest simulate: --replicas must be >= 1", file=sys.stderr)
        return 2
    policies = args.policy or ["cache_aware", "prefix", "round_robin", "least_loaded"]
    try:
        routing = {k: yaml.safe_load(v) for k, _, v in (o.partition("=") for o in args.routing)}
        for pol in policies:
            if pol != SGLANG_MODEL:
                SimConfig(policy="cache_aware" if pol == PRECISE else pol,
                          routing=routing).routing_settings()
    except (ValueError, yaml.YAMLError) as exc:
        print(f"prefix-loadtest simulate: {exc}", file=sys.stderr)
        return 2
    if args.trace:
        try:
            reqs = list(mooncake_requests(args.trace, args.requests, args.time_scale,
                                          args.max_output_tokens, args.repeat, args.block_size))
        except OSError as exc:
            print(f"prefix-loadtest simulate: cannot read trace {args.trace}: {exc}", file=sys.stderr)
            return 2
        except ValueError as exc:  # names the line
            print(f"prefix-loadtest simulate: bad trace line {exc}", file=sys.stderr)
            return 2
    base = SimConfig(replicas=args.replicas, block_size=args.block_size, kv_blocks=args.kv_blocks,
                     max_num_seqs=args.max_num_seqs, routers=args.routers,
                     peer_delay=args.peer_delay)
    if args.bench_cell:
        try:
            reqs, base = bench_cell(args.bench_cell, args.replicas, args.seed)
            base = replace(base, routers=args.routers, peer_delay=args.peer_delay)
        except ValueError as exc:
            print(f"prefix-loadtest simulate: {exc}", file=sys.stderr)
            return 2
    elif not args.trace:
        reqs = workload_requests(args.workload, args.requests or 1000, args.seed, args.rate)
    results = []
    top = ceiling(reqs, base)
    print(f"one-cache ceiling ({top.num_blocks} blocks, {top.requests} requests): hit rate "
          f"{top.hit_rate:.3f}")
    print(f"{'policy':<14}{'requests':>9}{'hit rate':>10}{'÷ ceiling':>10}{'TTFT p50':>10}"
          f"{'TTFT p99':>10}{'max/mean':>10}{'wall s':>8}")
    for pol in policies:
        cfg = replace(base, policy=pol, load_factor=args.load_factor, load_floor=args.load_floor,
                      prompt_affinity=args.prompt_affinity, routing=routing)
        res = simulate(reqs, cfg)
        results.append(res.to_json())
        m = res.misses
        total = sum(m.values()) or 1
        print(f"{pol:<14}{res.requests:>9}{res.hit_rate:>10.3f}{res.of_ceiling:>10.3f}"
              f"{res.ttft['p50']:>10.3f}"
              f"{res.ttft['p99']:>10.3f}{res.load_max_over_mean:>10.2f}{res.wall_seconds:>8.1f}"
              f"   miss: cold {m['cold'] / total:.3f} elsewhere {m['elsewhere'] / total:.3f} "
              f"lost queued {m['lost_queued'] / total:.3f}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    return 0
