"""The one routing entry point: request -> `Routed` (decision + what the outcome will write).

`Router.route(path, headers, body, seq, tap, pool)` is called by the app for every proxied
request and by ``loadtest.simulate`` for every simulated arrival, so both run exactly this code:

0. the model pool (`router.models.select_pool`, chosen by the caller: it answers 404/503 for a
   model with no routable pool): every step below sees only the pool's replicas - the ring walk,
   the bounded-load cap, the candidates, the retry order. The index is shared by the fleet but
   its chunk hashes are seeded with the model name (an adapter is its own model name), so two
   models or two adapters of one base never share credit;
1. ``keys.derive`` -> the routing key (static prefix, cut at the first volatile token; else the
   conversation) - the consistent-hash placement every policy starts from;
2. policy ``cache_aware``: ``chunks.request_chunks`` over the whole request, the prefix index's
   predicted cached tokens per replica, the queued work per replica, the ring rank of each
   replica (the key's consistent-hash walk; for a request cached nowhere, the replicas that
   hold nothing and have nothing in flight first, in walk order; for a new conversation
   behind a known preamble, the least recently written-to first), then
   ``pipeline.Pipeline.pick`` (filter -> scorers -> picker);
   policies ``prefix`` / ``round_robin`` / ``least_loaded``: ``policy.choose`` alone (pure, no
   state: ``prefix`` is the hash-only placement nginx reproduces);
3. for a LoRA adapter's pool under ``prefix`` or ``cache_aware``: `router.models.lora_affinity`
   over the decision's candidate order (best-scored first for ``cache_aware``), which is the
   pipeline's filter "keep the under-cap replicas of the best LoRA tier" followed by its picker;
   branch ``lora_affinity`` when it moved the request.

The returned `Routed` is the request's outcome recorder; the proxy (or the simulator) calls it
as attempts happen (`router.proxy.Attempts`):
``started(replica)`` adds the request's predicted prefill on that replica to the replica's
queued work; ``served(replica, status)`` - the replica's response started, so its prompt is in
that replica's KV cache - removes it again and, for a status below 400, writes the request's
chunks to the index for that replica (once); ``ended(replica)`` removes whatever is still
queued. Selection itself never writes routing state: a request that failed on one replica and
was retried on another is indexed only on the one that answered, and a failed request writes
nothing.

Hold: when the pick is a replica where an earlier streamed request of this router is still
prefilling at least ``hold_tokens`` more of this request's prompt than the index predicts there
(`router.prefix_index.InFlight.leader`), the returned `Routed` names it as ``leader``; the
caller dispatches this request only once the leader's ``when_answered`` fired (its response
started, so the prefix is cached, or its attempt ended), or after ``hold_timeout``. Routing
itself waits for nothing.

Precise routing (``routing.kv_events``): the ``exact`` hook (`router.kv_events`) adds the
request's exact block keys to its chunks (``Chunks.exact``, its exact prompt tokens as
``total``); the index (`router.kv_events.index.KvIndex`) matches them against what the
replicas' own KV events report and answers from the approximate index for the rest.

Cost (cache_aware): O(prompt) hashing, O(chunks) index lookups, O(N) scoring; no tokenizer
(with precise routing: plus the render and incremental encode of `router.kv_events`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from router.chunks import NO_CHUNKS, Chunks, request_chunks
from router.keys import KeyConfig, KeySource, RoutingKey, derive, key_config
from router.models import Pool, lora_affinity
from router.pipeline import (
    Candidate,
    Pipeline,
    RequestView,
    bounded_load,
    cache_score,
    home_score,
    load_score,
    queued_work,
    recent_load,
    request_share,
)
from router.policy import Branch, Decision, LoadBound, Policy, make_policy
from router.prefix_index import ApproxIndex, InFlight, PrefixIndex
from router.replicas import ReplicaSet, ReplicaState
from router.settings import RoutingSettings
from router.usage import UsageTap

__all__ = ["AttemptSink", "ExactKeys", "FollowUpWork", "RecentLoad", "Routed", "Router"]

# path, parsed body, model pool -> the request's exact block keys (`Chunks.exact`) or None
ExactKeys = Callable[[str, Mapping[str, Any] | None, Pool | None], Chunks | None]


class AttemptSink(Protocol):
    """Where a request's attempts are announced to other router processes (``routing.peers``:
    `router.peers.state.Outbox`)."""

    def rid(self) -> int:
        """A new request id, unique within this process."""
        ...

    def started(self, routed: Routed, replica: str, prefill: float) -> None: ...

    def served(self, routed: Routed, replica: str, status: int) -> None: ...

    def ended(self, routed: Routed, replica: str) -> None: ...


_EMA = 0.05  # weight of one request in the running mean of predicted prefill tokens


def _streams(body: Mapping[str, Any] | None) -> bool:
    return isinstance(body, Mapping) and body.get("stream") is True


def _novel_key(chunks: Chunks, known: int) -> str | None:
    """The hash of the first chunk past ``known`` tokens, as a ring key."""
    for h, t in zip(chunks.hashes, chunks.tokens, strict=True):
        if t > known:
            return f"{h:016x}"
    return None


class RecentLoad:
    """Requests dispatched to each replica over a sliding window of about ``window`` requests.

    Exponentially decayed: each dispatch multiplies every count by ``1 - 1/window`` and adds 1
    to its replica's (done lazily: the increment grows instead, and all counts are rescaled
    when it gets large), so the counts sum to at most ``window`` and ``count(r)`` is, in units
    of one request now, how many of the recent ones went to ``r``. The router keeps two: the
    first turns over ``routing.rate_window`` x the available replicas (read by
    `router.pipeline.recent_load`) and every request over ``routing.share_window`` x the
    available replicas (read by `router.pipeline.request_share`), so each window follows the
    fleet size. Written on dispatch (an attempt started: `Routed.started`). Cost: O(1) per
    dispatch and per read, O(replicas) once every few thousand dispatches.
    """

    __slots__ = ("_counts", "_inc")

    def __init__(self) -> None:
        self._inc = 1.0
        self._counts: dict[str, float] = {}

    def add(self, replica: str, window: float) -> None:
        if window > 1:
            self._inc /= 1.0 - 1.0 / window
        else:  # a window of one request: only the latest counts
            self._counts.clear()
        self._counts[replica] = self._counts.get(replica, 0.0) + self._inc
        if self._inc > 1e12:
            inc = self._inc
            self._counts = {k: v / inc for k, v in self._counts.items() if v / inc > 1e-9}
            self._inc = 1.0

    def count(self, replica: str) -> float:
        return self._counts.get(replica, 0.0) / self._inc

    def forget(self, replica: str) -> None:
        self._counts.pop(replica, None)


class FollowUpWork:
    """Follow-up prefill per new conversation, over the recent dispatches.

    Every dispatched chat first turn counts one conversation start; every other dispatched
    request adds its predicted prefill (the tokens its replica still has to compute: a turn's
    new messages, or a whole history moved elsewhere). ``per_conversation()`` is their ratio:
    the prefill a new conversation brings later, on whichever replica holds its history. Both
    sums decay by ``1 - 1/window`` per dispatch, so the ratio follows about the last ``window``
    requests. It starts at ``prior_tokens`` (as if ``_PRIOR`` conversations had brought that
    much each), so a fresh router bounds the rate of new conversations until the traffic shows
    they bring less. Written on dispatch (`Routed.started`), never during selection. Cost: O(1)
    per dispatch and per read.
    """

    __slots__ = ("_decay", "_later", "_starts")
    _PRIOR = 4.0

    def __init__(self, prior_tokens: float, window: float = 256.0) -> None:
        self._decay = 1.0 - 1.0 / window
        self._later = prior_tokens * self._PRIOR
        self._starts = self._PRIOR

    def first(self) -> None:
        d = self._decay
        self._later *= d
        self._starts = self._starts * d + 1.0

    def later(self, prefill: float) -> None:
        d = self._decay
        self._later = self._later * d + prefill
        self._starts *= d

    def per_conversation(self) -> float:
        return self._later / self._starts if self._starts > 0 else float("inf")


class Routed:
    """One request's routing decision and its outcome hooks (`router.proxy.Attempts`)."""

    __slots__ = ("_in_flight", "_index", "_on_start", "_open", "_peers", "_reserved", "_waiters",
                 "cached", "chunks", "decision", "key", "leader", "peer_rid", "prompt_tokens",
                 "served_by", "stream", "tap")

    def __init__(self, key: RoutingKey, decision: Decision, chunks: Chunks,
                 cached: Mapping[str, int], index: PrefixIndex | None,
                 tap: UsageTap | None, in_flight: InFlight | None = None,
                 on_start: Callable[[str, float], None] | None = None,
                 stream: bool = False, peers: AttemptSink | None = None) -> None:
        self.key = key
        self.decision = decision
        self.chunks = chunks
        self.prompt_tokens = chunks.total
        self.cached = cached
        self.tap = tap
        self.stream = stream  # a streamed response: its first byte comes right after prefill
        self.served_by: str | None = None
        # an earlier request of this router prefilling this one's prefix on the chosen
        # replica: the caller holds this request until that one answers (`when_answered`)
        self.leader: Routed | None = None
        self._index = index
        self._in_flight = in_flight
        self._on_start = on_start
        self._open: dict[str, float] = {}
        self._waiters: list[Callable[[], None]] | None = None
        self._reserved: tuple[ReplicaState, float] | None = None
        # routing.peers: this request's attempts are published to the other router processes
        self._peers = peers
        self.peer_rid = 0 if peers is None else peers.rid()

    def hold_behind(self, leader: Routed, replica: ReplicaState) -> bool:
        """Hold this request behind ``leader`` on ``replica``. While held it is committed
        there: its predicted prefill counts as queued work on ``replica`` and its chunks as
        in flight there (so later decisions, a follow-up turn included, see it), until it is
        dispatched (`started`) or the leader answers or ends, whichever comes first - so a
        request abandoned while held leaves nothing behind once its leader is done. False (and
        no hold) when the leader is not prefilling any more."""
        if not leader.when_answered(self._unreserve):
            return False
        cost = self.prefill_on(replica.name)
        replica.pending_prefill += cost
        self._reserved = (replica, cost)
        if self._in_flight is not None:
            self._in_flight.add(replica.name, self.chunks, self)
        self.leader = leader
        return True

    def _unreserve(self) -> None:
        held = self._reserved
        if held is not None:
            self._reserved = None
            replica, cost = held
            replica.pending_prefill = max(0.0, replica.pending_prefill - cost)
            if self._in_flight is not None:
                self._in_flight.remove(replica.name, self.chunks, self)

    @property
    def prefilling(self) -> bool:
        """Dispatched (or held behind a leader: it will prefill next), and no attempt has
        answered or ended since."""
        return self.served_by is None and (bool(self._open) or self._reserved is not None)

    def when_answered(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` once, when an attempt of this request is answered or ends; False
        (and no call) when none is prefilling now."""
        if not self.prefilling:
            return False
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(callback)
        return True

    def prefill_on(self, replica: str) -> float:
        """Predicted prompt tokens ``replica`` would have to prefill for this request."""
        return max(0.0, float(self.prompt_tokens - self.cached.get(replica, 0)))

    def started(self, replica: ReplicaState) -> None:
        if self._reserved is not None:
            self._unreserve()
        name = replica.name
        cost = max(0.0, float(self.prompt_tokens - self.cached.get(name, 0)))  # prefill_on
        self._open[name] = cost
        replica.unstarted += 1
        replica.pending_prefill += cost
        if self._in_flight is not None:
            self._in_flight.add(name, self.chunks, self)
        if self._on_start is not None:
            self._on_start(name, cost)
        if self._peers is not None:
            self._peers.started(self, name, cost)

    def _release(self, replica: ReplicaState) -> None:
        cost = self._open.pop(replica.name, None)
        if cost is not None:
            replica.unstarted -= 1
            replica.pending_prefill = max(0.0, replica.pending_prefill - cost)
            if self._in_flight is not None:
                self._in_flight.remove(replica.name, self.chunks, self)
        waiters = self._waiters
        if waiters:
            self._waiters = None
            for callback in waiters:
                callback()

    def served(self, replica: ReplicaState, status: int) -> None:
        self._release(replica)
        if status < 400 and self.served_by is None:
            self.served_by = replica.name
            if self._index is not None:
                self._index.record(replica.name, self.chunks)
        if self._peers is not None:
            self._peers.served(self, replica.name, status)

    def ended(self, replica: ReplicaState) -> None:
        self._release(replica)
        if self._peers is not None:
            self._peers.ended(self, replica.name)

    @property
    def predicted(self) -> int:
        """Cached tokens predicted on the replica that served (0 before one did)."""
        return 0 if self.served_by is None else self.cached.get(self.served_by, 0)


class Router:
    """Routing for one process: the policy or pipeline, and the prefix index it learns in."""

    def __init__(self, settings: RoutingSettings, replicas: ReplicaSet,
                 index: PrefixIndex | None = None, exact: ExactKeys | None = None) -> None:
        self.settings = settings
        self.replicas = replicas
        # precise routing (router.kv_events): the request's exact block keys, carried to the
        # index as ``chunks.exact``; None when off or when the request has none
        self.exact = exact
        self.key_config: KeyConfig = key_config(settings)
        self.bound = LoadBound(settings.load_factor, settings.cache_load_floor
                               if settings.policy == "cache_aware" else settings.load_floor)
        # the policies that keep the bounded-load cap (and so take LoRA affinity)
        self._bounded = settings.policy in ("prefix", "cache_aware")
        self.policy: Policy | None = None
        self.pipeline: Pipeline | None = None
        self.recent: RecentLoad | None = None
        self.share: RecentLoad | None = None
        self.index: PrefixIndex | None = None
        if settings.policy == "cache_aware":
            self.index = index or ApproxIndex(settings.kv_capacity_tokens,
                                              settings.index_max_entries)
            filters = [bounded_load(self.bound)]
            if settings.rate_factor:
                self.recent = RecentLoad()
                filters.append(recent_load(settings.rate_factor, settings.rate_first_turns))
            if settings.share_factor:
                self.share = RecentLoad()
                filters.append(request_share(settings.share_factor, settings.share_slack,
                                             settings.min_match_tokens))
            self.pipeline = Pipeline(
                filters,
                [(cache_score, settings.cache_weight), (load_score, settings.load_weight),
                 (home_score, settings.home_weight)],
                settings.min_match_tokens)
        else:
            self.policy = make_policy(settings.policy, settings.load_factor, settings.load_floor)
        self.in_flight = InFlight()
        # the cache score of a conversation's first turn, relative to a later turn's
        self._first_factor = (settings.first_turn_cache_weight / settings.cache_weight
                              if settings.cache_weight else 1.0)
        self._capacity: dict[str, int] = {}
        self._mean_prefill = 0.0
        # the bounded rate of first turns applies while new conversations bring at least
        # routing.rate_min_follow_tokens of follow-up prefill each (0: always)
        self.follow = FollowUpWork(settings.rate_min_follow_tokens)
        self._fleet = 1  # available replicas at the last decision
        # routing.peers: publishes this process's attempts (`router.peers`); None: off
        self.outbox: AttemptSink | None = None

    def route(self, path: str, headers: Mapping[str, str], body: Mapping[str, Any] | None,
              seq: int, tap: UsageTap | None = None, pool: Pool | None = None) -> Routed | None:
        """The decision for one request (``None``: no replica available), among the replicas
        of ``pool`` (`router.models.select_pool`; ``None``: the whole fleet)."""
        key = derive(path, headers, body, self.key_config)
        fleet_states = self.replicas.states()
        states = fleet_states if pool is None else pool.members
        if self.pipeline is None:
            assert self.policy is not None
            decision = self.policy.choose(key, states, self.replicas.ring, seq)
            if decision is None:
                return None
            return Routed(key, self._lora(pool, decision, states), NO_CHUNKS, {}, None, tap,
                          peers=self.outbox)
        s = self.settings
        chunks = request_chunks(path, body, s.chunk_chars, s.chars_per_token)
        if self.exact is not None:
            exact = self.exact(path, body, pool)
            if exact is not None:  # exact tokens replace the estimate wherever it was used
                chunks = chunks._replace(total=exact.total, exact=exact)
        assert self.index is not None
        self._sync_capacity(fleet_states)
        cached: dict[str, int] = {}
        known: Mapping[str, int] = {}
        in_flight = self.in_flight
        if chunks.hashes:
            known = self.index.match(chunks)
            cached = dict(known)
            if len(in_flight):
                for name, n in in_flight.match(chunks).items():
                    if n > cached.get(name, 0):
                        cached[name] = n
        prompt = chunks.total
        available = [r for r in states if r.available]
        fleet = len(available)
        self._fleet = max(1, fleet)
        best = max(cached.values(), default=0)
        cold_key = key.ring_key
        scored = cached
        if 0 < best < s.match_threshold * prompt and key.source is not KeySource.HEADER:
            # a known preamble followed by mostly new content: a new conversation. Place it
            # by its first unknown chunk (chained: unique to this conversation), not onto
            # whichever replica holds the preamble, so conversations spread over the fleet's
            # KV caches. Nothing known anywhere: the static prefix's home, as nginx would.
            cold_key = _novel_key(chunks, best) or cold_key
            scored = {}
        rank: dict[str, int] = {}
        if cold_key is not None:
            names = {r.name for r in available}
            walk = [n for n in self.replicas.ring.walk(cold_key) if n in names]
            index = self.index
            if not scored and cached:
                # a new conversation behind a known preamble: onto the replica that took the
                # least new content lately (the least eviction pressure), ring order on ties
                walk.sort(key=lambda n: index.inserted(n))
            elif not cached and key.source is not KeySource.HEADER:
                # nothing of it cached anywhere: a replica that holds nothing and has nothing
                # in flight (a fresh fleet, a replica added or restarted) takes it first, in
                # walk order - otherwise two prefixes sharing a home leave a replica idle. An
                # X-Prefix-Hash key is the client's own placement: always its ring home
                busy = {r.name for r in available if r.load() > 0}
                walk.sort(key=lambda n: n in busy or index.used(n) > 0)
            rank = {n: i for i, n in enumerate(walk)}
        mean = self._mean_prefill
        recent = self.recent
        share = self.share
        candidates = [Candidate(r, scored.get(r.name, 0),
                                queued_work(r, prompt, s.decode_tokens, mean, s.kv_high),
                                rank.get(r.name, fleet),
                                0.0 if recent is None else recent.count(r.name),
                                0.0 if share is None else share.count(r.name))
                      for r in available]
        first = key.first_turn
        factor = (self._first_factor if first and self._first_factor != 1.0
                  and not self._caches_full(available) else 1.0)
        gate = s.rate_min_follow_tokens
        spread = not gate or self.follow.per_conversation() >= gate
        decision = self.pipeline.pick(RequestView(key, prompt, cold_key is not None, factor,
                                                  first, spread), candidates)
        if decision is None:
            return None
        decision = self._lora(pool, decision, states)
        routed = Routed(key, decision, chunks, cached, self.index, tap, in_flight,
                        self._dispatched if first or not s.rate_first_turns else self._counted,
                        _streams(body), self.outbox)
        pick = decision.replica
        if s.hold_tokens and cached.get(pick, 0) - known.get(pick, 0) >= s.hold_tokens:
            lead = in_flight.leader(chunks, pick)
            if lead is not None:
                leader, tokens = lead
                assert isinstance(leader, Routed)
                if leader.stream and tokens - known.get(pick, 0) >= s.hold_tokens:
                    for r in available:
                        if r.name == pick:
                            routed.hold_behind(leader, r)
                            break
        return routed

    @property
    def mean_prefill(self) -> float:
        """The running mean of the predicted prefill of dispatched requests (tokens)."""
        return self._mean_prefill

    def mirror(self, replica: str, chunks: Chunks, prefill: float, stream: bool,
               first: bool) -> Routed:
        """Another router process's attempt on ``replica`` as a request of this one
        (`router.peers.state.PeerState`): its outcome hooks write this process's queued work,
        in-flight set, index and recent counts exactly as a local request's do, with the
        prefill the peer predicted. It publishes nothing."""
        key = RoutingKey(None, None, KeySource.NONE, first_turn=first)
        cached = {replica: max(0, chunks.total - round(prefill))}
        on_start = None
        if self.pipeline is not None:
            s = self.settings
            on_start = self._dispatched if first or not s.rate_first_turns else self._counted
        return Routed(key, Decision(replica, Branch.HOME, (replica,)), chunks, cached,
                      self.index, None, self.in_flight if self.pipeline is not None else None,
                      on_start, stream)

    def _caches_full(self, available: Sequence[ReplicaState]) -> bool:
        """Whether the index counts the available replicas' caches (those with a scraped
        capacity) as fuller than ``kv_high`` of it. Then a first turn's cold copy of its
        preamble on another replica is not paid once: it evicts other content and is evicted in
        turn, so the first-turn cache discount is off. O(N)."""
        index, capacity = self.index, self._capacity
        assert index is not None
        used = total = 0
        for r in available:
            cap = capacity.get(r.name)
            if cap:
                total += cap
                used += index.used(r.name)
        return total > 0 and used >= self.settings.kv_high * total

    def _counted(self, replica: str, prefill: float) -> None:
        """A later turn was dispatched (with ``rate_first_turns``; else `_dispatched` counts
        every request): its predicted prefill enters the running mean that prices other
        routers' waiting requests and is follow-up work (`FollowUpWork`), and the dispatch
        counts in the long-run request share of ``replica``."""
        self._account(replica, prefill)
        self.follow.later(prefill)

    def _dispatched(self, replica: str, prefill: float) -> None:
        """A first turn was dispatched: its predicted prefill enters the running mean, it is a
        conversation start (`FollowUpWork`), and the dispatch counts in the long-run share and
        the recent request counts of ``replica``."""
        self._account(replica, prefill)
        self.follow.first()
        if self.recent is not None:
            self.recent.add(replica, self.settings.rate_window * self._fleet)

    def _account(self, replica: str, prefill: float) -> None:
        """What every dispatch updates: the running mean of predicted prefill and the long-run
        request share of ``replica``."""
        self._mean_prefill += _EMA * (prefill - self._mean_prefill)
        if self.share is not None:
            self.share.add(replica, self.settings.share_window * self._fleet)

    def _lora(self, pool: Pool | None, decision: Decision,
              states: Sequence[ReplicaState]) -> Decision:
        """LoRA affinity for an adapter's pool (`router.models.lora_affinity`); the baselines
        (``round_robin``, ``least_loaded``) stay model-aware but adapter-blind."""
        if pool is None or not pool.adapter or not self._bounded:
            return decision
        return lora_affinity(pool.label, decision, states, self.bound)

    def _sync_capacity(self, states: tuple[ReplicaState, ...]) -> None:
        """Hand scraped KV capacities to the index (only when one changed)."""
        known = self._capacity
        assert self.index is not None
        for r in states:
            cap = r.kv_capacity
            if cap and known.get(r.name) != cap:
                known[r.name] = cap
                self.index.set_capacity(r.name, cap)

    def forget(self, names: set[str]) -> None:
        """Replicas that left the membership: drop what the index knows of them."""
        for name in names:
            self._capacity.pop(name, None)
            if self.recent is not None:
                self.recent.forget(name)
            if self.share is not None:
                self.share.forget(name)
            if self.index is not None:
                self.index.forget(name)
