"""router.pipeline: each scorer, the filter, and the branch label of every decision path."""

from __future__ import annotations

import pytest

from router.keys import KeySource, RoutingKey
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
from router.policy import Branch, LoadBound
from router.replicas import ReplicaState

PREFIX = RoutingKey("p" * 8, "conv", KeySource.PREFIX)


def cand(name: str, cached: int = 0, queued: float = 0.0, rank: int = 0,
         in_flight: int = 0) -> Candidate:
    return Candidate(ReplicaState(name, f"http://{name}", in_flight=in_flight), cached, queued,
                     rank)


def pipe(floor: int = 8, home: float = 0.1) -> Pipeline:
    return Pipeline([bounded_load(LoadBound(1.25, floor))],
                    [(cache_score, 1.0), (load_score, 1.0), (home_score, home)], 64)


def test_scorers_are_in_unit_range() -> None:
    req = RequestView(PREFIX, 1000)
    for c in (cand("a"), cand("a", cached=5000, queued=10**9, rank=9), cand("a", 1000, 0, 0)):
        for scorer in (cache_score, load_score, home_score):
            assert 0.0 <= scorer(req, c, 1000.0 + c.queued, 4) <= 1.0
    assert home_score(req, cand("a", rank=0), 1.0, 4) == 1.0
    assert home_score(req, cand("a", rank=1), 1.0, 4) == 0.5
    assert home_score(req, cand("a", rank=4), 1.0, 4) == 0.0  # keyless: no home


def test_queued_work_prices_prefill_decode_others_and_kv_pressure() -> None:
    r = ReplicaState("a", "http://a", in_flight=2, pending_prefill=500.0, unstarted=4,
                     waiting=3.0, scraped_unstarted=1)
    # 500 pending + 32 decode x max(2 ours, 3 scraped) + (3 waiting - 1 of ours) x 100 prefill
    assert queued_work(r, 1000, 32.0, 100.0, 0.9) == 500 + 96 + 200
    r.kv_usage = 0.95  # half-way between kv_high and full: half a prompt more
    assert queued_work(r, 1000, 32.0, 100.0, 0.9) == pytest.approx(796 + 500)


@pytest.mark.parametrize(("candidates", "key", "expected", "branch"), [
    # nothing cached, equal loads: the key's ring home (cold placement)
    ([cand("a", rank=1), cand("b", rank=0)], PREFIX, "b", Branch.HOME),
    ([cand("a", rank=1), cand("b", rank=0)], RoutingKey("h", None, KeySource.HEADER), "b",
     Branch.OVERRIDE),
    ([cand("a", rank=1), cand("b", rank=0)], RoutingKey(None, "c", KeySource.CONVERSATION), "b",
     Branch.CONVERSATION),
    # the replica holding the prompt wins over the home
    ([cand("a", cached=900, rank=1), cand("b", rank=0)], PREFIX, "a", Branch.CACHE_HIT),
    # ... until queueing there costs more than one cold prefill elsewhere: it replicates
    ([cand("a", cached=900, queued=2000, rank=0), cand("b", rank=1)], PREFIX, "b", Branch.SPILL),
    # a partial match queued behind load loses to an idle full match elsewhere: still a hit
    ([cand("a", cached=900, rank=0), cand("b", cached=300, rank=1)], PREFIX, "a",
     Branch.CACHE_HIT),
    # no key and nothing cached: the least queued
    ([cand("a", queued=50, rank=2), cand("b", queued=10, rank=2)],
     RoutingKey(None, None, KeySource.NONE), "b", Branch.LEAST_LOADED),
])
def test_branch_names_the_scorer_that_decided(candidates: list[Candidate], key: RoutingKey,
                                              expected: str, branch: Branch) -> None:
    d = pipe().pick(RequestView(key, 1000, key.ring_key is not None), candidates)
    assert d is not None and (d.replica, d.branch) == (expected, branch)
    assert d.candidates[0] == expected and sorted(d.candidates) == sorted(
        c.name for c in candidates)


def test_bounded_load_filter_keeps_the_pick_under_cap() -> None:
    # a holds everything but is at cap (floor 0: cap = ceil(1.25 * 9 / 2) = 6)
    cs = [cand("a", cached=1000, in_flight=6, rank=0), cand("b", in_flight=2, rank=1)]
    d = pipe(floor=0).pick(RequestView(PREFIX, 1000), cs)
    assert d is not None and d.replica == "b" and d.branch is Branch.SPILL
    assert d.candidates == ("b", "a")  # the filtered-out replica is still a retry target
    assert d.predicted == 0


def test_fallback_when_every_replica_is_filtered() -> None:
    def nobody(req: RequestView, cs: list[Candidate]) -> list[Candidate]:
        return []

    p = Pipeline([nobody], [(load_score, 1.0)], 64)
    d = p.pick(RequestView(PREFIX, 10), [cand("a", in_flight=3), cand("b", in_flight=1)])
    assert d is not None and (d.replica, d.branch) == ("b", Branch.FALLBACK)
    assert p.pick(RequestView(PREFIX, 10), []) is None


def recent(name: str, count: float, weight: int = 1) -> Candidate:
    return Candidate(ReplicaState(name, f"http://{name}", weight=weight), 0, 0.0, 0, count)


def test_recent_load_keeps_replicas_within_their_share_of_recent_requests() -> None:
    keep = recent_load(1.25)
    req = RequestView(PREFIX, 100)
    # 16 recent requests (+1, this one) over 4 replicas: a fair share of 4.25 each, cap 5.31
    got = keep(req, [recent("a", 10), recent("b", 2), recent("c", 2), recent("d", 2)])
    assert [c.name for c in got] == ["b", "c", "d"]
    # small counts never bind (one request of slack), and the filter never empties the set
    assert len(keep(req, [recent("a", 1), recent("b", 0)])) == 2
    assert len(keep(req, [recent("a", 5)])) == 1
    # a replica of weight 2 may take twice the share
    got = keep(req, [recent("a", 6, weight=2), recent("b", 3), recent("c", 3)])
    assert [c.name for c in got] == ["a", "b", "c"]


def test_recent_load_on_first_turns_only_lets_later_turns_follow_their_cache() -> None:
    keep = recent_load(1.25, first_turns=True)
    crowded = [recent("a", 10), recent("b", 1)]
    assert [c.name for c in keep(RequestView(PREFIX, 100), crowded)] == ["a", "b"]
    first = RequestView(PREFIX, 100, first_turn=True)
    assert [c.name for c in keep(first, crowded)] == ["b"]


def test_a_hot_first_turn_over_its_share_goes_to_the_next_best_cache() -> None:
    p = Pipeline([recent_load(1.25, first_turns=True)],
                 [(cache_score, 4.0), (load_score, 1.0), (home_score, 0.02)], 64)
    hot = Candidate(ReplicaState("a", "http://a"), 900, 0.0, 0, 12.0)
    copy = Candidate(ReplicaState("b", "http://b"), 400, 0.0, 1, 2.0)
    cold = Candidate(ReplicaState("c", "http://c"), 0, 0.0, 2, 2.0)
    d = p.pick(RequestView(PREFIX, 1000, first_turn=True), [hot, copy, cold])
    assert d is not None and (d.replica, d.branch) == ("b", Branch.SPILL)
    assert d.candidates[-1] == "a"  # the filtered-out replica is still a retry target
    d = p.pick(RequestView(PREFIX, 1000), [hot, copy, cold])  # a later turn: not bounded
    assert d is not None and (d.replica, d.branch) == ("a", Branch.CACHE_HIT)


def shared(name: str, share: float, cached: int = 0, rank: int = 0) -> Candidate:
    return Candidate(ReplicaState(name, f"http://{name}"), cached, 0.0, rank, 0.0, share)


# (first turn?, [(name, share, cached)], kept) - factor 1.25, slack 2; 4 replicas whose shares
# sum to 39 (+1, this request): a fair share of 10, so under share while share + 1 <= 14.5
SHARE_CASES = [
    # new work goes only to the replicas under share, even away from its cache
    (True, [("a", 21, 900), ("b", 6, 0), ("c", 6, 0), ("d", 6, 0)], ["b", "c", "d"]),
    # a follow-up keeps its holder however far ahead it is (its history lives there) ...
    (False, [("a", 21, 900), ("b", 6, 0), ("c", 6, 0), ("d", 6, 0)], ["a", "b", "c", "d"]),
    # ... and may move only to a replica under share: c, over share, is no spill target
    (False, [("a", 12, 900), ("b", 5, 0), ("c", 16, 300), ("d", 6, 0)], ["a", "b", "d"]),
    # nothing cached anywhere: not bounded, cold placement stays the ring's (nginx parity)
    (True, [("a", 21, 0), ("b", 6, 0), ("c", 6, 0), ("d", 6, 0)], ["a", "b", "c", "d"]),
    # every replica holding the longest prefix is kept
    (False, [("a", 20, 900), ("b", 13, 900), ("c", 3, 0), ("d", 3, 0)], ["a", "b", "c", "d"]),
]


@pytest.mark.parametrize(("first", "rows", "kept"), SHARE_CASES)
def test_request_share_admits_new_work_under_share_and_keeps_follow_ups_sticky(
        first: bool, rows: list[tuple[str, float, int]], kept: list[str]) -> None:
    keep = request_share(1.25, 2.0)
    got = keep(RequestView(PREFIX, 1000, first_turn=first), [shared(*r) for r in rows])
    assert [c.name for c in got] == kept


def test_request_share_slack_and_weights() -> None:
    keep = request_share(1.0, 3.0)
    new = RequestView(PREFIX, 100, first_turn=True)
    # small counts never bind: 3 requests of slack
    assert len(keep(new, [shared("a", 3, 50), shared("b", 0)])) == 2
    assert [c.name for c in keep(new, [shared("a", 6, 50), shared("b", 0)])] == ["b"]
    # the filter never empties the set
    assert len(keep(new, [shared("a", 50, 50)])) == 1
    # a replica of weight 2 may take twice the share: 27 (+1) over weight 4 -> 7 a weight
    heavy = Candidate(ReplicaState("a", "http://a", weight=2), 50, 0.0, 0, 0.0, 15.0)
    got = keep(new, [heavy, shared("b", 6), shared("c", 6)])
    assert [c.name for c in got] == ["a", "b", "c"]
    got = keep(new, [shared("a", 15, 50), shared("b", 6), shared("c", 6)])  # weight 1: over
    assert [c.name for c in got] == ["b", "c"]
    # below min_match tokens cached anywhere counts as cold: the ring places it
    cold = request_share(1.0, 3.0, min_match=64)
    assert len(cold(new, [shared("a", 6, 50), shared("b", 0)])) == 2


def test_a_first_turn_over_its_share_replicates_the_prefix_onto_the_best_other_cache() -> None:
    p = Pipeline([request_share(1.15, 2.0)],
                 [(cache_score, 8.0), (load_score, 1.0), (home_score, 0.02)], 64)
    hot = shared("a", 30, cached=900)
    copy = shared("b", 5, cached=400, rank=2)
    cold = shared("c", 5, rank=1)
    d = p.pick(RequestView(PREFIX, 1000, first_turn=True), [hot, copy, cold])
    assert d is not None and (d.replica, d.branch) == ("b", Branch.SPILL)
    assert d.candidates[-1] == "a"  # the filtered-out replica is still a retry target
    d = p.pick(RequestView(PREFIX, 1000), [hot, copy, cold])  # a later turn stays
    assert d is not None and (d.replica, d.branch) == ("a", Branch.CACHE_HIT)


def default_pipe() -> Pipeline:
    """The cache_aware scorers with the default weights (the one place they are set)."""
    from router.settings import RoutingSettings as S

    return Pipeline([], [(cache_score, S.cache_weight), (load_score, S.load_weight),
                         (home_score, S.home_weight)], S.min_match_tokens)


@pytest.mark.parametrize(("held", "holder_queue", "other_queue", "expected", "branch"), [
    # the mooncake shape: a 2k-token follow-up, 1,536 tokens of it on the replica with the
    # deepest queue, the shared 512-token block elsewhere - it stays with its history
    (1536, 24_000, 12_000, "holder", Branch.CACHE_HIT),
    # 512 tokens more history against a 6k-token queue difference: stays (at 8x it moved)
    (1024, 16_000, 10_000, "holder", Branch.CACHE_HIT),
    # a deeper queue still moves it: the weight trades, it does not pin
    (1024, 20_000, 10_000, "other", Branch.SPILL),
    # nothing but the shared block anywhere: the shorter queue
    (512, 20_000, 10_000, "other", Branch.CACHE_HIT),
])
def test_default_cache_weight_keeps_short_follow_ups_on_their_history(
        held: int, holder_queue: float, other_queue: float, expected: str,
        branch: Branch) -> None:
    req = RequestView(PREFIX, 2000)
    got = default_pipe().pick(req, [cand("holder", held, holder_queue, rank=0),
                                    cand("other", 512, other_queue, rank=1)])
    assert got is not None and (got.replica, got.branch) == (expected, branch)


def _reference_pick(p: Pipeline, req: RequestView, candidates: list[Candidate]):  # type: ignore[no-untyped-def]
    """`Pipeline.pick` as first written: every kept candidate scored and sorted, the
    bounded-load filter computing every cap. The table test below holds the shortcuts (one
    kept candidate, all loads under the floor) to it."""
    from router.pipeline import _decision

    kept = candidates
    for f in p.filters:
        kept = f(req, kept)
    if not kept:
        ranked = sorted(candidates, key=lambda c: (c.state.load() / c.state.weight, c.rank))
        return _decision(ranked, Branch.FALLBACK, candidates)
    fleet = len(candidates)
    scale = float(req.prompt_tokens) + max([c.queued for c in kept]) or 1.0
    scored = [(sum(w * s(req, c, scale, fleet) for s, w in p.scorers), -c.rank, -i)
              for i, c in enumerate(kept)]
    top_cached = max([c.cached for c in candidates])
    ranked = [kept[i] for i in sorted(range(len(kept)), key=scored.__getitem__, reverse=True)]
    best = ranked[0]
    if best.cached >= max(1, p.min_match_tokens) and best.cached >= top_cached:
        branch = Branch.CACHE_HIT
    elif best.rank == 0 and req.placed:
        branch = {KeySource.HEADER: Branch.OVERRIDE,
                  KeySource.CONVERSATION: Branch.CONVERSATION}.get(req.key.source, Branch.HOME)
    elif not req.placed and top_cached < max(1, p.min_match_tokens):
        branch = Branch.LEAST_LOADED
    else:
        branch = Branch.SPILL
    return _decision(ranked, branch, candidates)


def test_pick_matches_the_reference_on_random_fleets() -> None:
    import random

    rng = random.Random(18)
    keys = [PREFIX, RoutingKey("h", None, KeySource.HEADER),
            RoutingKey(None, "c", KeySource.CONVERSATION), RoutingKey(None, None, KeySource.NONE)]
    for _ in range(3000):
        n = rng.randint(1, 6)
        cands = [Candidate(ReplicaState(f"r{i}", f"http://r{i}", in_flight=rng.choice(
                     [0, 0, 1, 3, 7, 8, 9, 20, 40])), rng.choice([0, 0, 32, 64, 500, 900]),
                     rng.choice([0.0, 10.0, 500.0, 2000.0]), rng.randint(0, n), rng.random() * 4)
                 for i in range(n)]
        filters = [bounded_load(LoadBound(rng.choice([1.0, 1.25, 2.0]), rng.choice([0, 4, 8])))]
        if rng.random() < 0.5:
            filters.append(recent_load(2.0, rng.random() < 0.5))
        p = Pipeline(filters, [(cache_score, rng.choice([1.0, 16.0])), (load_score, 1.0),
                               (home_score, 0.1)], rng.choice([1, 64]))
        key = rng.choice(keys)
        req = RequestView(key, rng.choice([0, 100, 1000]), key.ring_key is not None,
                          rng.choice([1.0, 0.5]), rng.random() < 0.5)
        assert p.pick(req, cands) == _reference_pick(p, req, cands)
