"""router.routing: the one entry point; index writes come from outcomes only."""

from __future__ import annotations

from typing import Any

import pytest

from router.discovery.base import Endpoint
from router.policy import Branch
from router.replicas import ReplicaSet, ReplicaState
from router.routing import Routed, Router
from router.settings import Settings

CHAT = "/v1/chat/completions"


def router(**routing: Any) -> Router:
    rs = ReplicaSet([Endpoint(f"r{i}", f"http://127.0.0.1:{9100 + i}") for i in range(4)])
    return Router(Settings.from_dict({"routing": {"policy": "cache_aware", **routing}}).routing,
                  rs)


def body(*turns: str, system: str = "You answer questions about the billing system. " * 40
         ) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for i, t in enumerate(turns):
        msgs.append({"role": "user", "content": t})
        if i < len(turns) - 1:
            msgs.append({"role": "assistant", "content": f"answer to {t}"})
    return {"model": "m", "messages": msgs}


def answer(routed: Routed, state: ReplicaState, status: int = 200) -> None:
    """One attempt that the replica answered, as the proxy reports it."""
    routed.started(state)
    routed.served(state, status)
    routed.ended(state)


def test_selection_writes_nothing_and_failures_write_nothing() -> None:
    r = router()
    routed = r.route(CHAT, {}, body("q1"), 1)
    assert routed is not None and routed.decision.branch is Branch.HOME
    assert r.index is not None and r.index.match(routed.chunks) == {}
    state = r.replicas.get(routed.decision.replica)
    assert state is not None
    routed.started(state)
    assert state.unstarted == 1 and state.pending_prefill == routed.prompt_tokens
    routed.ended(state)  # failed before its response started
    assert (state.unstarted, state.pending_prefill) == (0, 0.0)
    assert r.index.match(routed.chunks) == {} and len(r.in_flight) == 0


def test_a_retried_request_is_indexed_on_the_replica_that_answered() -> None:
    r = router()
    routed = r.route(CHAT, {}, body("q1"), 1)
    assert routed is not None
    first, second = (r.replicas.get(n) for n in routed.decision.candidates[:2])
    assert first is not None and second is not None
    routed.started(first)
    routed.ended(first)  # connect refused: the proxy moves on
    answer(routed, second)
    assert r.index is not None
    assert r.index.match(routed.chunks) == {second.name: routed.prompt_tokens}
    assert routed.served_by == second.name and routed.predicted == 0
    # an error answer from the last candidate is relayed but indexes nothing
    other = r.route(CHAT, {}, body("q9", system="another prompt " * 60), 2)
    assert other is not None
    state = r.replicas.get(other.decision.replica)
    assert state is not None
    other.started(state)
    other.served(state, 500)
    assert r.index.match(other.chunks) == {}


def test_next_turn_follows_the_replica_that_served_the_last() -> None:
    r = router()
    placed = {}
    for conv in ("a", "b", "c", "d", "e", "f"):
        routed = r.route(CHAT, {}, body(f"first {conv}"), 1)
        assert routed is not None
        state = r.replicas.get(routed.decision.replica)
        assert state is not None
        answer(routed, state)
        placed[conv] = state.name
    for conv, where in placed.items():
        nxt = r.route(CHAT, {}, body(f"first {conv}", "second"), 2)
        assert nxt is not None
        assert (nxt.decision.replica, nxt.decision.branch) == (where, Branch.CACHE_HIT)
        assert nxt.decision.predicted > 0.9 * body_tokens(nxt.prompt_tokens)


def body_tokens(n: int) -> int:
    return n - 40  # the new user turn and its template markup are not cached


def test_a_burst_queues_behind_the_first_of_a_new_prefix() -> None:
    r = router()
    first = r.route(CHAT, {}, body("q1"), 1)
    assert first is not None
    state = r.replicas.get(first.decision.replica)
    assert state is not None
    state.in_flight += 1
    first.started(state)  # prefilling, not answered yet
    second = r.route(CHAT, {}, body("q2"), 2)
    assert second is not None and second.decision.replica == state.name
    assert second.decision.branch is Branch.CACHE_HIT


def test_scraped_capacity_bounds_the_index() -> None:
    r = router(kv_capacity_tokens=100_000)
    rep = r.replicas.get("r0")
    assert rep is not None
    rep.kv_capacity = 300  # tokens; the prompt has about 500
    routed = r.route(CHAT, {}, body("q"), 1)
    assert routed is not None and r.index is not None
    r0 = r.replicas.get("r0")
    assert r0 is not None
    answer(routed, r0)
    assert 0 < r.index.used("r0") <= 300 < routed.prompt_tokens  # type: ignore[attr-defined]


def test_first_turns_weigh_the_cached_preamble_less_than_later_turns() -> None:
    r = router()
    warm = r.route(CHAT, {}, body("q0"), 1)
    assert warm is not None
    holder = r.replicas.get(warm.decision.replica)
    assert holder is not None
    answer(warm, holder)
    holder.pending_prefill = 3 * warm.prompt_tokens  # queued work there: more than a cold copy
    first = r.route(CHAT, {}, body("new conversation"), 2)
    later = r.route(CHAT, {}, body("q0", "follow-up"), 3)
    assert first is not None and later is not None
    assert first.decision.replica != holder.name  # the preamble is copied once, elsewhere
    assert (later.decision.replica, later.decision.branch) == (holder.name, Branch.CACHE_HIT)


def test_first_turns_keep_the_full_cache_weight_once_the_caches_are_full() -> None:
    # the test above, but the holder's scraped capacity is what its index holds: a copy of the
    # preamble elsewhere would evict other content there, so the first turn stays on its cache
    r = router()
    warm = r.route(CHAT, {}, body("q0"), 1)
    assert warm is not None and r.index is not None
    holder = r.replicas.get(warm.decision.replica)
    assert holder is not None
    answer(warm, holder)
    holder.kv_capacity = r.index.used(holder.name)  # the only capacity known: full
    holder.pending_prefill = 3 * warm.prompt_tokens
    first = r.route(CHAT, {}, body("new conversation"), 2)
    assert first is not None
    assert (first.decision.replica, first.decision.branch) == (holder.name, Branch.CACHE_HIT)
    holder.kv_capacity = 4 * r.index.used(holder.name)  # room again: the discount is back
    again = r.route(CHAT, {}, body("another conversation"), 3)
    assert again is not None and again.decision.replica != holder.name


def started(r: Router, routed: Routed) -> ReplicaState:
    state = r.replicas.get(routed.decision.replica)
    assert state is not None
    state.in_flight += 1
    routed.started(state)
    return state


def streamed(*turns: str) -> dict[str, Any]:
    return {**body(*turns), "stream": True}


def test_a_burst_is_held_behind_the_request_prefilling_its_prefix() -> None:
    r = router()
    first = r.route(CHAT, {}, streamed("q1"), 1)
    assert first is not None and first.leader is None  # nothing in flight yet
    state = started(r, first)
    second = r.route(CHAT, {}, streamed("q2"), 2)
    assert second is not None and second.decision.replica == state.name
    assert second.leader is first and first.prefilling
    woken: list[str] = []
    assert first.when_answered(lambda: woken.append("answered"))
    first.served(state, 200)  # its first token: the prefix is cached now
    assert woken == ["answered"] and not first.prefilling
    assert not first.when_answered(lambda: woken.append("late"))  # nothing left to wait for
    third = r.route(CHAT, {}, streamed("q3"), 3)
    assert third is not None and third.leader is None  # the index predicts the prefix now
    assert woken == ["answered"]


@pytest.mark.parametrize(("routing", "leader_body", "why"), [
    ({"hold_tokens": 0}, streamed("q1"), "holding is off"),
    ({}, body("q1"), "a non-streamed leader's first byte is its whole answer"),
    ({"hold_tokens": 100_000}, streamed("q1"), "the shared prefix is shorter than hold_tokens"),
])
def test_no_hold(routing: dict[str, Any], leader_body: dict[str, Any], why: str) -> None:
    r = router(**routing)
    first = r.route(CHAT, {}, leader_body, 1)
    assert first is not None
    started(r, first)
    second = r.route(CHAT, {}, streamed("q2"), 2)
    assert second is not None and second.leader is None, why


def test_a_leader_that_fails_wakes_its_followers_and_leaves_nothing() -> None:
    r = router()
    first = r.route(CHAT, {}, streamed("q1"), 1)
    assert first is not None
    state = started(r, first)
    second = r.route(CHAT, {}, streamed("q2"), 2)
    assert second is not None and second.leader is first
    woken: list[int] = []
    first.when_answered(lambda: woken.append(1))
    first.ended(state)  # connect refused: no response
    assert woken == [1] and len(r.in_flight) == 0
    assert r.index is not None and r.index.match(first.chunks) == {}


def test_a_held_request_counts_as_queued_work_until_it_starts() -> None:
    r = router()
    first = r.route(CHAT, {}, streamed("q1"), 1)
    assert first is not None
    state = started(r, first)
    before = state.pending_prefill
    second = r.route(CHAT, {}, streamed("q2 " * 200), 2)
    assert second is not None and second.leader is first
    cost = second.prefill_on(state.name)
    assert cost > 0 and state.pending_prefill == pytest.approx(before + cost)
    started(r, second)  # dispatched after its hold: counted once, as a started attempt
    assert state.pending_prefill == pytest.approx(before + cost)
    assert state.unstarted == 2


def test_a_held_request_abandoned_leaves_nothing_once_its_leader_answers() -> None:
    r = router()
    first = r.route(CHAT, {}, streamed("q1"), 1)
    assert first is not None
    state = started(r, first)
    second = r.route(CHAT, {}, streamed("q2 " * 200), 2)
    assert second is not None and second.leader is first
    assert r.in_flight.match(second.chunks).get(state.name) == second.chunks.tokens[-1]
    # the client goes away while held: the proxy never dispatches it
    first.served(state, 200)
    first.ended(state)
    assert state.pending_prefill == 0.0 and len(r.in_flight) == 0


def test_a_follow_up_of_a_held_turn_finds_it_and_holds_behind_it() -> None:
    r = router()
    first = r.route(CHAT, {}, streamed("q1"), 1)
    assert first is not None
    state = started(r, first)
    held = r.route(CHAT, {}, streamed("q2 " * 200), 2)
    assert held is not None and held.leader is first and held.prefilling
    follow = r.route(CHAT, {}, streamed("q2 " * 200, "and then?"), 3)
    assert follow is not None and follow.decision.replica == state.name
    assert follow.cached[state.name] >= held.chunks.tokens[-1]  # the held turn, in flight
    assert follow.leader is held
    woken: list[str] = []
    assert held.when_answered(lambda: woken.append("held answered"))
    started(r, held)
    held.served(state, 200)
    assert woken == ["held answered"]


def test_first_turns_spread_by_their_share_of_recent_requests() -> None:
    r = router(rate_factor=1.25, rate_window=4, rate_min_follow_tokens=0)  # bound always on
    assert r.recent is not None
    served = []
    for i in range(40):
        routed = r.route(CHAT, {}, body(f"question {i}"), i)
        assert routed is not None
        state = r.replicas.get(routed.decision.replica)
        assert state is not None
        answer(routed, state)
        served.append(state.name)
    counts = [served.count(f"r{i}") for i in range(4)]
    assert max(counts) <= 1.25 * 10 + 2, counts  # one shared preamble, spread anyway
    # a later turn is not bounded: it follows its conversation's cache
    later = r.route(CHAT, {}, body("question 3", "more"), 99)
    assert later is not None and later.decision.replica == served[3]


def test_recent_load_counts_decay_over_the_window() -> None:
    from router.routing import RecentLoad

    rl = RecentLoad()
    for _ in range(100):
        rl.add("a", 10)
    assert 9.0 < rl.count("a") <= 10.0  # the window holds about 10 requests
    for _ in range(30):
        rl.add("b", 10)
    assert rl.count("a") < 0.5 and rl.count("b") > 9.0
    rl.add("c", 1)  # a window of one: only the latest counts
    assert (rl.count("a"), rl.count("c")) == (0.0, 1.0)
    rl.forget("c")
    assert rl.count("c") == 0.0
    for _ in range(5000):  # the lazy increment is rescaled, counts stay finite
        rl.add("a", 2)
    assert 1.9 < rl.count("a") <= 2.0


def test_new_conversations_steer_away_from_a_replica_busy_with_follow_ups() -> None:
    r = router(rate_factor=0, share_factor=1.2, share_slack=1)
    assert r.share is not None
    first = r.route(CHAT, {}, body("q0"), 0)
    assert first is not None
    home = r.replicas.get(first.decision.replica)
    assert home is not None
    answer(first, home)
    turns = ["q0"]
    for i in range(1, 12):  # one long conversation: every follow-up stays with its history
        turns.append(f"step {i}")
        later = r.route(CHAT, {}, body(*turns), i)
        assert later is not None and later.decision.replica == home.name
        answer(later, home)
    assert r.share.count(home.name) > 11  # follow-ups count in the share
    for i in range(12, 20):  # new conversations of the same preamble go elsewhere
        new = r.route(CHAT, {}, body(f"question {i}"), i)
        assert new is not None and new.decision.replica != home.name
        state = r.replicas.get(new.decision.replica)
        assert state is not None
        answer(new, state)


def _cold_walk(r: Router, request: dict[str, Any]) -> list[str]:
    """The ring walk of ``request``'s routing key, over the fleet."""
    from router.keys import derive

    key = derive(CHAT, {}, request, r.key_config).ring_key
    assert key is not None
    return list(r.replicas.ring.walk(key))


def _warm(r: Router, name: str, system: str) -> None:
    """``name`` served (and so caches) one request of another prompt."""
    routed = r.route(CHAT, {}, body("warm", system=system), 0)
    assert routed is not None
    state = r.replicas.get(name)
    assert state is not None
    answer(routed, state)


# (which replicas hold something or are busy, by position on the new key's walk -> where the
#  cold request goes, by walk position; why)
@pytest.mark.parametrize(("warm", "busy", "expect", "why"), [
    ((), (), 0, "an empty fleet: the ring home (nginx parity)"),
    ((0,), (), 1, "the home holds something: the first empty replica on the walk"),
    ((0, 1), (), 2, "walk order among the empty replicas"),
    ((0, 1, 2, 3), (), 0, "every replica holds something: the ring home again"),
    ((0,), (1,), 2, "a replica with requests in flight is not empty"),
])
def test_a_new_prefix_fills_an_empty_replica_before_its_home(
        warm: tuple[int, ...], busy: tuple[int, ...], expect: int, why: str) -> None:
    r = router()
    new = body("q", system="A prompt no replica has seen. " * 60)
    walk = _cold_walk(r, new)
    for i in warm:
        _warm(r, walk[i], f"content held by {walk[i]} " * 50)
    for i in busy:
        state = r.replicas.get(walk[i])
        assert state is not None
        state.in_flight += 1
    routed = r.route(CHAT, {}, new, 1)
    assert routed is not None, why
    assert routed.decision.replica == walk[expect], why
    # the placement's home: the ring home, or the empty replica that stood in for it
    assert (routed.decision.branch, routed.decision.home) == (Branch.HOME, walk[expect]), why


def test_an_x_prefix_hash_key_goes_to_its_ring_home_even_with_empty_replicas() -> None:
    r = router()
    walk = list(r.replicas.ring.walk("client-key"))
    _warm(r, walk[0], "content held by the home " * 50)  # the others are empty
    routed = r.route(CHAT, {"x-prefix-hash": "client-key"}, body("q", system="unseen " * 60), 1)
    assert routed is not None
    assert (routed.decision.replica, routed.decision.branch) == (walk[0], Branch.OVERRIDE)


def _conversations(r: Router, n: int, later_turns: int, pasted: str) -> list[str]:
    """``n`` conversations of one shared preamble, each first turn followed at once by
    ``later_turns`` turns that paste ``pasted``; the replica of each first turn."""
    firsts = []
    for i in range(n):
        turns = [f"question {i}"]
        for t in range(later_turns + 1):
            routed = r.route(CHAT, {}, body(*turns), i)
            assert routed is not None
            state = r.replicas.get(routed.decision.replica)
            assert state is not None
            answer(routed, state)
            if t == 0:
                firsts.append(state.name)
            turns.append(f"turn {t} of {i}: {pasted}")
    return firsts


# (later turns per conversation, text each pastes -> first turns spread over the fleet; why)
@pytest.mark.parametrize(("later_turns", "pasted", "spread", "why"), [
    (0, "", False, "single-turn requests: no follow-up work, all stay with the shared preamble"),
    (3, "ok", False, "short follow-ups: a few tokens each, not worth a copy of the preamble"),
    (3, "pasted logs " * 300, True, "follow-ups of ~1k new tokens each: new conversations spread"),
])
def test_the_rate_bound_spreads_first_turns_only_when_follow_ups_bring_work(
        later_turns: int, pasted: str, spread: bool, why: str) -> None:
    r = router(rate_factor=1.25, rate_window=4)
    firsts = _conversations(r, 24, later_turns, pasted)
    late = firsts[8:]  # once the tracker has seen the traffic (it starts from its prior)
    assert (len(set(late)) > 1) is spread, (why, firsts)
    follow = r.follow.per_conversation()
    assert (follow >= 512) is spread, (why, follow)


def test_follow_up_work_per_conversation() -> None:
    from router.routing import FollowUpWork

    w = FollowUpWork(512, window=1e12)  # (almost) no decay: plain ratios
    assert w.per_conversation() == pytest.approx(512)  # the prior: 4 starts of 512 tokens
    for _ in range(4):
        w.first()
    assert w.per_conversation() == pytest.approx(256)  # 2048 tokens over 8 starts
    w.later(2048)
    assert w.per_conversation() == pytest.approx(512)
    d = FollowUpWork(0, window=2)  # each dispatch halves everything before it
    d.later(1000)  # later 1000, starts 4 x 0.5 = 2
    d.first()  # later 500, starts 2 x 0.5 + 1 = 2
    assert d.per_conversation() == pytest.approx(250)
