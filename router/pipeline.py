"""The ``cache_aware`` routing pipeline: filter -> pure scorers in [0, 1] -> picker. Pure.

Input: a `RequestView` (the routing key, the request's estimated prompt tokens) and one
`Candidate` per available replica (its state, the tokens the prefix index predicts it holds
for this request, the work already queued on it, its rank on the key's ring walk).

1. **Filters** (`Filter`: candidates -> candidates, in order). `bounded_load` keeps the
   replicas under the bounded-load cap of `router.policy.LoadBound` (requests in flight,
   ``load_factor`` x the average, never below ``cache_load_floor``: the cost model moves load
   long before that; the cap is the safety net). `recent_load` spreads new conversations
   over a short window of first turns; `request_share` keeps each replica's share of the
   whole run's requests near its fair share by admitting new work only where it is under
   share, while follow-ups keep their history. Further filters (a model or LoRA pool) plug
   in the same way. Nothing left -> the least loaded available replica, branch
   ``fallback``.
2. **Scorers** (`Scorer`: pure, returns [0, 1]) on a common scale ``T = prompt tokens + the
   largest queued work among the candidates``, so that cache and load are measured in the same
   unit - prefill tokens:
   - ``cache``: predicted cached tokens / T - the prefill this replica would not have to do;
   - ``load``: 1 - queued work / T - the prefill and decode work already waiting there;
   - ``home``: 2^-rank on the consistent-hash walk of the key's static prefix: 1 for the home.
   With equal cache and load weights, ``cache + load`` is ``2 - (prompt - cached + queued) / T``:
   the best replica is the one where this request's prefill plus the queue ahead of it is
   smallest, as in Dynamo's KV router; a larger cache weight also charges a cold prefill for
   the work it queues ahead of later requests. A hot prompt therefore stays on the replicas
   that hold it until queueing there costs more than ``cache_weight / load_weight`` cold
   prefills elsewhere, then replicates.
   ``home`` is the tie-breaker: when nothing is cached and loads are equal the key's ring home
   wins, so router processes with no shared state place a new prefix on the same replica and
   ``ring: nginx`` parity holds for cold keys (the caller ranks the walk: for a cold request,
   replicas that hold nothing and have nothing in flight come first, so an empty replica
   fills before the homes do; `router.routing.Router.route`).
3. **Picker**: the highest weighted sum; ties by ring rank. The candidates tuple (the retry
   order) is the pick followed by the rest by score.

Branch (the scorer that decided; API values, also a metric label):
``cache_hit`` - the pick holds at least ``min_match_tokens`` of the prompt and no candidate
(filtered out or not) holds more; ``home`` / ``override`` / ``conversation`` - otherwise, the pick is the key's home
(the key came from the prefix / the ``X-Prefix-Hash`` header / the conversation identity);
``spill`` - otherwise: load moved the request off both its home and its best cache;
``least_loaded`` - a request with no key and no cached prefix; ``fallback`` - every replica was
filtered out.

Queued work of a replica (`queued_work`), in prefill tokens: the predicted uncached tokens of
this router's requests on it that have not produced a first byte yet, plus ``decode_tokens``
per request in flight there (this router's, or the scraped running + waiting, whichever is
larger), plus the scraped waiting requests this router did not send, each costing the average
prefill (the waiting count minus this router's unanswered requests there at the time of the
scrape), plus - above ``kv_high`` KV-cache usage - up to one more prompt of this size, since a
new sequence there waits for blocks or preempts one.

Invariant: whenever some available replica is under the bounded-load cap, the pick is under
cap (the filter runs first). Cost: O(N) per request for N replicas (scores are a few float
operations each), plus a sort of N for the retry order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from router.keys import KeySource, RoutingKey
from router.policy import Branch, Decision, LoadBound
from router.replicas import ReplicaState

__all__ = [
    "Candidate",
    "Filter",
    "Pipeline",
    "RequestView",
    "Scorer",
    "bounded_load",
    "cache_score",
    "home_score",
    "load_score",
    "queued_work",
    "recent_load",
    "request_share",
]


class RequestView(NamedTuple):  # NamedTuples: built per request, cheaper than frozen dataclasses
    key: RoutingKey
    prompt_tokens: int  # estimated tokens of the whole prompt
    placed: bool = True  # the candidates carry a ring rank (a routing key exists)
    cache_factor: float = 1.0  # scales the cache score (a conversation's first turn: < 1)
    first_turn: bool = False  # a chat request without assistant or tool turns
    # new conversations bring enough follow-up work to be spread (`recent_load`'s first turns;
    # `router.routing.FollowUpWork`)
    spread: bool = True


class Candidate(NamedTuple):
    state: ReplicaState
    cached: int  # tokens of this request the index predicts the replica holds
    queued: float  # work already queued on the replica, in prefill tokens (`queued_work`)
    rank: int  # position on the key's ring walk (0 = home); the fleet size when keyless
    recent: float = 0.0  # requests recently sent to the replica (`routing.RecentLoad`)
    share: float = 0.0  # requests sent to the replica over the long window (`request_share`)

    @property
    def name(self) -> str:
        return self.state.name


class Scorer(Protocol):
    def __call__(self, req: RequestView, c: Candidate, scale: float, fleet: int) -> float:
        """A value in [0, 1]; ``scale`` is the request's common token scale T, ``fleet`` the
        number of available replicas."""
        ...


Filter = Callable[[RequestView, list[Candidate]], list[Candidate]]


def cache_score(req: RequestView, c: Candidate, scale: float, fleet: int) -> float:
    return req.cache_factor * min(c.cached, req.prompt_tokens) / scale


def load_score(req: RequestView, c: Candidate, scale: float, fleet: int) -> float:
    return 1.0 - min(c.queued, scale) / scale


def home_score(req: RequestView, c: Candidate, scale: float, fleet: int) -> float:
    return 0.0 if c.rank >= fleet else 0.5 ** c.rank


def bounded_load(bound: LoadBound) -> Filter:
    """The candidates under the bounded-load cap, over all available replicas' loads."""

    floor = bound.floor

    def keep(req: RequestView, candidates: list[Candidate]) -> list[Candidate]:
        loads = [c.state.load() for c in candidates]
        if max(loads, default=0.0) < floor:  # every cap is at least the floor: all under it
            return candidates
        total = sum(loads)
        weight = sum(c.state.weight for c in candidates)
        cap = bound.cap
        kept = [c for c, load in zip(candidates, loads, strict=True)
                if load < cap(c.state, total, weight)]
        return kept if len(kept) < len(candidates) else candidates

    return keep


def recent_load(factor: float, first_turns: bool = False) -> Filter:
    """The candidates whose share of recent requests stays within ``factor`` x their fair share
    (by weight) once this request is added; none -> all (the filter never empties the set).

    ``recent`` counts the requests dispatched to each replica over a sliding window (decayed),
    so this bounds each replica's *request rate*, which the in-flight cap of `bounded_load`
    does not when requests are short: a replica is kept while
    ``recent + 1 <= factor x (total + 1) x weight / total weight + 1`` (the last term: one
    request of slack, so small counts never bind). With ``first_turns`` it bounds only chat
    first turns, and only those whose view says ``spread``: new conversations that bring little
    follow-up work are better kept with the preamble they share than copied onto more caches."""

    def keep(req: RequestView, candidates: list[Candidate]) -> list[Candidate]:
        if first_turns and not (req.first_turn and req.spread):
            return candidates
        total = 1.0
        weight = 0
        for c in candidates:
            total += c.recent
            weight += c.state.weight
        fair = factor * total / weight
        kept = [c for c in candidates if c.recent <= fair * c.state.weight]
        return kept or candidates

    return keep


def request_share(factor: float, slack: float, min_match: int = 1) -> Filter:
    """Admission of new work by long-run request share; follow-ups stay with their history.

    ``share`` counts every request dispatched to each replica, follow-ups included, over a
    long window (`router.routing.RecentLoad`, ``routing.share_window`` x N requests), so it
    tracks the share each replica takes of the whole run, which is what max/mean requests per
    replica measures. A replica is *under share* while ``share + 1 <= factor x (total + 1) x
    weight / total weight + slack`` (``slack``: requests of headroom, so small counts at the
    start of a run never bind). A chat first turn - a new conversation, the only moment it can
    move for free - is kept to the replicas under share, so it goes to the best cache among
    them: a hot preamble is copied onto a few more replicas instead of piling onto its holder.
    Any other request keeps every replica holding its longest cached prefix (moving it costs
    its whole history) and may otherwise only go to a replica under share, so a load spill
    never lands on a replica already ahead. A request with less than ``min_match`` tokens
    cached anywhere (``routing.min_match_tokens``, the ``cache_hit`` floor) keeps every
    replica: cold placement stays the ring's (``ring: nginx`` parity; router processes with
    different counts still agree). None kept -> all (the filter never empties the set).

    Invariant: a replica over share receives only cold requests and requests whose longest
    cached prefix it holds (or anything, when every replica is over share). Cost: O(N).
    """

    def keep(req: RequestView, candidates: list[Candidate]) -> list[Candidate]:
        total = 1.0
        weight = 0
        for c in candidates:
            total += c.share
            weight += c.state.weight
        top = max(c.cached for c in candidates)
        if top < max(1, min_match):  # cold: placed by the ring, as nginx and other routers
            return candidates
        fair = factor * total / weight
        sticky = not req.first_turn
        kept = [c for c in candidates if (sticky and c.cached == top)
                or c.share + 1 <= fair * c.state.weight + slack]
        return kept or candidates

    return keep


def queued_work(r: ReplicaState, prompt_tokens: int, decode_tokens: float, mean_prefill: float,
                kv_high: float) -> float:
    """Prefill-token cost of the work waiting on ``r`` before a new request (module docstring)."""
    work = r.pending_prefill + decode_tokens * r.load()
    others = r.waiting - r.scraped_unstarted  # as of the last good scrape (up to stale_after)
    if others > 0:
        work += others * mean_prefill
    if r.kv_usage > kv_high:
        work += prompt_tokens * min(1.0, (r.kv_usage - kv_high) / (1.0 - kv_high))
    return work


_HOME_BRANCH = {KeySource.HEADER: Branch.OVERRIDE, KeySource.CONVERSATION: Branch.CONVERSATION}


class Pipeline:
    """Filters, weighted scorers and the picker of one routing profile."""

    def __init__(self, filters: Sequence[Filter], scorers: Sequence[tuple[Scorer, float]],
                 min_match_tokens: int) -> None:
        self.filters = tuple(filters)
        self.scorers = tuple((s, w) for s, w in scorers if w > 0)
        self.min_match_tokens = min_match_tokens
        self._floor = max(1, min_match_tokens)  # the least a cache_hit holds

    def pick(self, req: RequestView, candidates: list[Candidate]) -> Decision | None:
        if not candidates:
            return None
        fleet = len(candidates)
        kept = candidates
        for f in self.filters:
            kept = f(req, kept)
        if not kept:
            ranked = sorted(candidates, key=lambda c: (c.state.load() / c.state.weight, c.rank))
            return _decision(ranked, Branch.FALLBACK, candidates)
        if len(kept) == 1:  # nothing to rank: the scores would only order this one
            ranked = kept
        else:
            scale = float(req.prompt_tokens) + max([c.queued for c in kept])
            if scale <= 0:
                scale = 1.0
            scorers = self.scorers
            scored = []
            for i, c in enumerate(kept):
                value = 0.0
                for scorer, weight in scorers:
                    value += weight * scorer(req, c, scale, fleet)
                scored.append((value, -c.rank, -i))
            order = sorted(range(len(kept)), key=scored.__getitem__, reverse=True)
            ranked = [kept[i] for i in order]
        # over every candidate: a filtered-out replica holding more makes the pick a spill
        top_cached = max([c.cached for c in candidates])
        best = ranked[0]
        floor = self._floor
        if best.cached >= floor and best.cached >= top_cached:
            branch = Branch.CACHE_HIT
        elif best.rank == 0 and req.placed:
            branch = _HOME_BRANCH.get(req.key.source, Branch.HOME)
        elif not req.placed and top_cached < floor:
            branch = Branch.LEAST_LOADED
        else:
            branch = Branch.SPILL
        return _decision(ranked, branch, candidates)


def _decision(ranked: list[Candidate], branch: Branch, everyone: list[Candidate]) -> Decision:
    """The pick, then the rest of ``ranked``, then any filtered-out candidate by ring rank."""
    order = [c.state.name for c in ranked]
    if len(ranked) < len(everyone):
        seen = set(order)
        order += [c.state.name for c in sorted(everyone, key=lambda c: c.rank)
                  if c.state.name not in seen]
    home = None
    for c in everyone:
        if c.rank == 0:
            home = c.state.name
            break
    return Decision(order[0], branch, tuple(order), home, ranked[0].cached)
