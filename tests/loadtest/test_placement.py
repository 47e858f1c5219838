"""Placement against eviction: the per-replica replay by hand and against the one-cache replay,
online policies that see only the past, and the clairvoyant partition search."""

from __future__ import annotations

import random

import pytest

from loadtest.ceiling import Prompt, replay
from loadtest.placement import (
    POLICIES,
    Fleet,
    replay_fleet,
    route_online,
    search_partition,
    transplant,
)

A, B, C = (11, 12), (21, 22), (31, 32)  # two full 4-token blocks each; prompts are 9 tokens


def test_replay_fleet_by_hand() -> None:
    prompts: list[Prompt] = [(A, 9), (B, 9), (A, 9), (B, 9)]
    # a prompt takes 3 blocks (2 full, 1 partial). One replica of 3 blocks: B evicts A and A
    # evicts B, nothing hits
    assert replay_fleet(prompts, [0, 0, 0, 0], 1, 3, 4).hit_tokens == 0
    # two replicas of 3 blocks, one prompt each: both return to their blocks
    got = replay_fleet(prompts, [0, 1, 0, 1], 2, 3, 4)
    assert (got.hit_tokens, got.query_tokens, got.num_blocks) == (16, 36, 6)
    # the same on the wrong replicas: each replica sees A and B in turn
    assert replay_fleet(prompts, [0, 1, 1, 0], 2, 3, 4).hit_tokens == 0
    with pytest.raises(ValueError, match="3 replicas assigned for 4 prompts"):
        replay_fleet(prompts, [0, 1, 0], 2, 3, 4)


def _random_prompts(rng: random.Random, n: int, groups: int) -> tuple[list[Prompt], list[int]]:
    prompts: list[Prompt] = []
    gs = []
    for i in range(n):
        g = rng.randrange(groups)
        prefix = tuple(1000 * g + k for k in range(rng.randint(1, 3)))
        prompts.append((prefix + (10**6 + i,), 4 * (len(prefix) + 1) + 1))
        gs.append(g)
    return prompts, gs


@pytest.mark.parametrize("seed", range(5))
def test_replay_fleet_is_per_replica_replay(seed: int) -> None:
    rng = random.Random(seed)
    prompts, _ = _random_prompts(rng, 60, 6)
    assign = [rng.randrange(3) for _ in prompts]
    got = replay_fleet(prompts, assign, 3, 5, 4)
    parts = [replay([p for p, a in zip(prompts, assign, strict=True) if a == r], 5, 4) for r in range(3)]
    assert got.hit_tokens == sum(p.hit_tokens for p in parts)
    assert got.query_tokens == sum(p.query_tokens for p in parts)
    # one replica of the whole capacity is the one-cache ceiling
    assert replay_fleet(prompts, [0] * len(prompts), 1, 15, 4) == replay(prompts, 15, 4)


def test_online_policies_see_only_the_past() -> None:
    prompts, _ = _random_prompts(random.Random(7), 40, 5)
    seen: list[int] = []

    def spy(f: Fleet, prompt: Prompt, rng: random.Random) -> int:
        # the pools hold exactly the earlier prompts' effects, and the placed counts add up
        seen.append(sum(f.placed))
        assert sum(p.queries for p in f.pools) == sum(t for _, t in prompts[: len(seen) - 1])
        return len(seen) % 2

    got, assign = route_online(prompts, spy, 2, 6, 4)
    assert seen == list(range(len(prompts)))
    assert assign == [(i + 1) % 2 for i in range(len(prompts))]
    assert got == replay_fleet(prompts, assign, 2, 6, 4)


def test_policies_by_hand() -> None:
    prompts: list[Prompt] = [(A, 9), (B, 9), (A, 9), (C, 9), (A, 9)]
    # precise: a cold prompt to the replica with the fewest requests, a hit where it is cached
    _, assign = route_online(prompts, POLICIES["precise"], 2, 4, 4)
    assert assign == [0, 1, 0, 1, 0]
    # home: the first block's hash modulo the replicas, whatever is cached
    D = (40, 42)
    _, assign = route_online([(A, 9), (D, 9), (A, 9), (B, 9)], POLICIES["home"], 2, 4, 4)
    assert assign == [1, 0, 1, 1]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_decides_from_the_past(name: str) -> None:
    # a decision cannot depend on a later prompt: the run cut short places its prompts alike
    prompts, _ = _random_prompts(random.Random(3), 50, 6)
    _, whole = route_online(prompts, POLICIES[name], 3, 6, 4, seed=5)
    for k in (1, 17, 33):
        assert route_online(prompts[:k], POLICIES[name], 3, 6, 4, seed=5)[1] == whole[:k]


def test_sacrificial_sends_cold_prompts_to_the_last_replica() -> None:
    from loadtest.placement import _sacrificial

    prompts: list[Prompt] = [(A, 9), (B, 9), (A, 9), (C, 9)]
    _, assign = route_online(prompts, _sacrificial(0.0), 3, 8, 4)
    assert assign == [2, 2, 2, 2]  # A's return is a hit where A is: the last replica
    _, assign = route_online(prompts, _sacrificial(1.0), 3, 8, 4)
    assert assign == [0, 1, 0, 1]  # every cold prompt admitted to the fewest-placed one


def test_quiet_head_avoids_evicting_shared_blocks() -> None:
    from loadtest.placement import _quiet_head

    # replica 0 holds A, which has come back once; replica 1 holds D, seen once: the cold C
    # goes to replica 1, and A's third visit still hits
    D = (41, 42)
    prompts: list[Prompt] = [(A, 9), (D, 9), (A, 9), (C, 9), (A, 9)]
    policy_assign: list[int] = []

    def pinned(f: Fleet, prompt: Prompt, rng: random.Random) -> int:
        r = [0, 1][len(policy_assign)] if len(policy_assign) < 2 else _quiet_head(f, prompt, rng)
        policy_assign.append(r)
        return r

    got, assign = route_online(prompts, pinned, 2, 3, 4)
    assert assign == [0, 1, 0, 1, 0]
    assert got.hit_tokens == 16
    # before A came back nothing is known to be shared: C would go by request counts alone
    policy_assign.clear()
    _, assign = route_online(prompts[:2] + prompts[3:4], pinned, 2, 3, 4)
    assert assign == [0, 1, 0]


@pytest.mark.parametrize("seed", range(3))
def test_search_partition_never_loses_to_its_start(seed: int) -> None:
    rng = random.Random(seed)
    prompts, groups = _random_prompts(rng, 80, 8)
    start, _ = search_partition(prompts, groups, 2, 6, 0, seed, 4)
    best, part = search_partition(prompts, groups, 2, 6, 60, seed, 4)
    assert best > start  # these runs have a better partition than the balanced one
    assert transplant(prompts, groups, part, 2, 6, 4) == pytest.approx(best)
    assert set(part) <= {0, 1}
    # deterministic for a seed
    assert search_partition(prompts, groups, 2, 6, 60, seed, 4) == (best, part)


def test_search_partition_of_nothing() -> None:
    assert search_partition([], [], 2, 6, 10) == (0.0, [])


def test_a_partition_covers_groups_its_run_lacks() -> None:
    prompts, groups = _random_prompts(random.Random(4), 30, 3)
    _, part = search_partition(prompts, groups, 2, 6, 5, 0, 4, num_groups=8)
    assert len(part) == 8 and set(part) <= {0, 1}
    other, other_groups = _random_prompts(random.Random(5), 30, 8)
    assert 0.0 <= transplant(other, other_groups, part, 2, 6, 4) <= 1.0
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        replay_fleet(other, [2] * len(other), 2, 6, 4)


@pytest.mark.parametrize(("args", "message"), [
    (["--seeds", "1,x"], "expected comma-separated integers, got '1,x'"),
    (["--replicas", "0"], "expected an integer >= 1, got '0'"),
    (["--steps", "-3"], "expected an integer >= 1, got '-3'"),
    (["--groups", "many"], "expected an integer >= 1, got 'many'"),
])
def test_cli_rejects_bad_arguments(args: list[str], message: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from loadtest.placement import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cell_prompts_carry_their_groups() -> None:
    from loadtest.placement import cell_prompts

    prompts, groups = cell_prompts(12, 0, groups=3)
    assert len(prompts) == len(groups) == 12 and set(groups) <= {0, 1, 2}
    first: dict[int, int] = {}
    for (hashes, tokens), g in zip(prompts, groups, strict=True):
        assert tokens > 5000  # a 5,000-7,000-token system prompt and a ~1,200-token question
        # the requests of a group share its system prompt's blocks, other groups none of them
        assert first.setdefault(g, hashes[0]) == hashes[0]
    assert len(set(first.values())) == len(first)
