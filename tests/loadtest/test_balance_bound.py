"""Offline balance bounds of whole conversations, and the hit bound of any router under a balance
cap (`loadtest.balance_bound`): hand-computed cases, an exhaustive search over placements of tiny
request sets on per-replica caches, and a property test over random ones (with the capacity-aware
`loadtest.ceiling.opt_bound`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtest.balance_bound import (
    Conversation,
    cell_bounds,
    copy_greedy,
    hit_bound,
    lower_bound,
    lpt,
    lpt_assign,
)
from loadtest.ceiling import opt_bound, replay
from templates_audit.blocks import PrefixCache, block_hashes

BS = 4  # tokens per block in these tests
Prompt = tuple[Sequence[int], int]


@pytest.mark.parametrize(("sizes", "replicas", "bound", "lpt_value"), [
    ([1] * 8, 4, 1.0, 1.0),  # single turns spread evenly
    ([10, 1, 1, 1, 1], 2, 10 / 7, 10 / 7),  # the largest conversation sets the bound
    ([3, 3, 2, 2, 2], 2, 1.0, 14 / 12),  # LPT misses the perfect split 6/6 (3+3 vs 2+2+2)
    ([5], 4, 4.0, 4.0),  # one conversation: one replica holds everything
    ([], 4, 1.0, 1.0),  # nothing to place
])
def test_bounds(sizes: list[int], replicas: int, bound: float, lpt_value: float) -> None:
    assert lower_bound(sizes, replicas) == pytest.approx(bound)
    assert lpt(sizes, replicas) == pytest.approx(lpt_value)
    assert lpt(sizes, replicas) >= lower_bound(sizes, replicas) - 1e-9


def test_lpt_assign_by_hand() -> None:
    # largest first, ties in index order: 5 -> r0, 4 -> r1, the 3 at index 0 -> r1 (4 < 5),
    # the 3 at index 3 -> r0 (5 < 7), 0 -> r1 (7 < 8); equal loads go to the lower replica
    assert lpt_assign([3, 5, 4, 3, 0], 2) == [1, 0, 1, 0, 1]
    assert lpt_assign([2, 2], 3) == [0, 1]
    assert lpt_assign([], 3) == []


def test_copy_greedy_keeps_a_group_together_while_it_fits() -> None:
    # two groups of 4 single requests on 2 replicas: each group fills one replica, no copy
    convs = [Conversation("a", 1, 100)] * 4 + [Conversation("b", 1, 50)] * 4
    p = copy_greedy(convs, 2, 1.0)
    assert (p.max_over_mean, p.copies, p.copy_tokens) == (1.0, 0, 0)


def test_copy_greedy_copies_a_hot_group_past_the_cap() -> None:
    # one group of 8 requests on 4 replicas at cap 1.0 (2 each): 3 copies of its 100-token prefix
    p = copy_greedy([Conversation("hot", 1, 100)] * 8, 4, 1.0)
    assert (p.max_over_mean, p.copies, p.copy_tokens) == (1.0, 3, 300)


def test_copy_greedy_cannot_split_a_conversation() -> None:
    # a conversation larger than the cap stays whole: max/mean is its size over the mean
    p = copy_greedy([Conversation("a", 6, 10), Conversation("b", 2, 10)], 2, 1.3)
    assert p.max_over_mean == pytest.approx(6 / 4)
    assert p.copies == 0


def _p(ids: Sequence[int]) -> Prompt:
    """A prompt of ``ids`` as `request_prompts` yields it: chained full-block hashes, tokens."""
    return block_hashes(list(ids), BS), len(ids)


SYS = list(range(100, 108))  # an 8-token shared prefix (2 blocks)
A = _p(SYS + [1])  # 9 tokens: 2 full blocks, both hit-eligible
B = _p(list(range(200, 208)) + [2])  # another 9-token prompt, nothing shared with A
AX = _p(SYS + [3, 4, 5, 6, 7])  # A's 2 blocks + 1 more, 13 tokens: 3 eligible
A8 = _p(SYS)  # 8 tokens: 2 full blocks, only the first eligible (the last token is computed)


@pytest.mark.parametrize(("prompts", "replicas", "target", "hit_blocks"), [
    # no cap: every eligible block seen before hits (4 copies of A: 3 x 2 blocks)
    ([A] * 4, 2, None, 6),
    # cap 2 of 4 requests on 2 replicas (max/mean 1.0): A's blocks are computed on both
    ([A] * 4, 2, 1.0, 4),
    # 1.5 x the mean = 3 still needs 2 replicas; 2.0 x = 4 allows one
    ([A] * 4, 2, 1.5, 4),
    ([A] * 4, 2, 2.0, 6),
    # two prompts that share nothing: no hits whatever the cap
    ([A, B], 2, None, 0),
    # an 8-token prompt's last block is never a hit: 2 copies share 1 eligible block
    ([A8, A8], 1, None, 1),
    # ... but it is cached: the longer prompt after it hits both blocks (the bound counts the
    # 8-token prompt as warming its last block)
    ([A8, AX], 1, None, 2),
    # a cap that cannot hold the requests (3 on 2 replicas at 1.0: at most 1 each) admits no
    # placement: 0
    ([A] * 3, 2, 1.0, 0),
    # shared heads: A and AX share 2 blocks; cap 2 on 2 replicas splits the 4 holders of them
    ([A, A, AX, AX], 2, 1.0, 2 * 2 + 1),
])
def test_hit_bound_by_hand(prompts: list[Prompt], replicas: int, target: float | None,
                           hit_blocks: int) -> None:
    got = hit_bound(prompts, replicas, target, BS)
    assert got.hit_tokens == BS * hit_blocks
    assert got.query_tokens == sum(t for _h, t in prompts)


def _fleet_hits(prompts: Sequence[Prompt], placement: Sequence[int], replicas: int,
                kv_blocks: int | None) -> int:
    """Hit tokens of a fleet of per-replica `PrefixCache`s serving ``prompts`` in order, the
    i-th on replica ``placement[i]`` (the simulated replica's block math, one at a time)."""
    caches = [PrefixCache(kv_blocks, BS) for _ in range(replicas)]
    return sum(caches[r].insert(h, t) for (h, t), r in zip(prompts, placement, strict=True))


def _within(placement: Sequence[int], replicas: int, target: float | None) -> bool:
    if target is None:
        return True
    cap = math.floor(target * len(placement) / replicas + 1e-9)
    return max(placement.count(r) for r in range(replicas)) <= cap


@pytest.mark.parametrize(("prompts", "replicas", "target", "tight"), [
    # one prefix, cap 2 on 3 replicas: three pairs reach the bound
    ([A] * 6, 3, 1.0, True),
    # two prompts of 3 each, cap 3 on 2 replicas: one replica each reaches it
    ([A] * 3 + [B] * 3, 2, 1.0, True),
    # A needs 2 replicas at cap 3, B one: A A A | A B B reaches it
    ([A] * 4 + [B] * 2, 2, 1.0, True),
    # shared heads in any order, cap 2 on 3 replicas
    ([A, AX, A, AX, B, B], 3, 1.0, True),
    # no cap: everything on one replica reaches it
    ([A, AX, B, A, B, AX], 2, None, True),
    # the warm block: it counts as warm though it comes after (order is ignored) - not tight
    ([AX, A8, AX], 2, None, False),
    # 3 replicas at 1.3: cap floor(2.6) = 2 of 6
    ([A, A, A, AX, AX, B], 3, 1.3, True),
])
def test_hit_bound_over_every_placement(prompts: list[Prompt], replicas: int,
                                        target: float | None, tight: bool) -> None:
    bound = hit_bound(prompts, replicas, target, BS).hit_tokens
    best = max(_fleet_hits(prompts, p, replicas, None)
               for p in itertools.product(range(replicas), repeat=len(prompts))
               if _within(p, replicas, target))
    assert best <= bound
    assert (best == bound) is tight, (best, bound)


@pytest.mark.parametrize(("prompts", "replicas", "kv_blocks"), [
    # 2 replicas of 3 blocks (a 9-token prompt takes 3): one prompt each at most
    ([A, B, A, B, A, B], 2, 3),
    # 3 replicas of 4 blocks, prompts of 3 and 4 blocks
    ([A, AX, B, A, AX, B], 3, 4),
    # 2 replicas of 6 blocks: two prompts fit together
    ([A, B, AX, A, B, AX], 2, 6),
])
def test_opt_bound_over_every_placement(prompts: list[Prompt], replicas: int,
                                        kv_blocks: int) -> None:
    # every placement on per-replica LRU caches stays within MIN over the fleet's total
    bound = opt_bound(prompts, replicas * kv_blocks, BS).hit_tokens
    best = max(_fleet_hits(prompts, p, replicas, kv_blocks)
               for p in itertools.product(range(replicas), repeat=len(prompts)))
    assert best <= bound


_prefixes = st.sampled_from([[], list(range(100, 104)), list(range(100, 110)),
                             list(range(100, 116)), list(range(300, 308))])
_prompt = st.tuples(_prefixes, st.lists(st.integers(0, 3), max_size=9)).map(
    lambda t: _p(t[0] + t[1]))


@settings(max_examples=200, deadline=None)
@given(prompts=st.lists(_prompt, min_size=1, max_size=12),
       replicas=st.integers(1, 4),
       target=st.sampled_from([None, 1.0, 1.3, 2.0]),
       kv_blocks=st.sampled_from([None, 3, 5, 8]),
       choices=st.lists(st.integers(0, 3), min_size=12, max_size=12))
def test_no_placement_beats_the_bounds(prompts: list[Prompt], replicas: int,
                                       target: float | None, kv_blocks: int | None,
                                       choices: list[int]) -> None:
    # random request sets sharing random heads, placed at random within the cap on per-replica
    # caches: the fleet's hits never exceed either bound
    n = len(prompts)
    cap = n if target is None else math.floor(target * n / replicas + 1e-9)
    if cap * replicas < n:
        cap = -(-n // replicas)  # no placement meets the target: bound 0, nothing to check
        target = None
    loads = [0] * replicas
    placement = []
    for c in choices[:n]:
        free = [r for r in range(replicas) if loads[r] < cap]
        r = free[c % len(free)]
        loads[r] += 1
        placement.append(r)
    hits = _fleet_hits(prompts, placement, replicas, kv_blocks)
    assert hits <= hit_bound(prompts, replicas, target, BS).hit_tokens
    total = None if kv_blocks is None else replicas * kv_blocks
    assert hits <= opt_bound(prompts, total, BS).hit_tokens
    # and the one-cache LRU replay (one replica of the total) is itself a placement
    assert replay(prompts, total, BS).hit_tokens <= opt_bound(prompts, total, BS).hit_tokens


def test_cell_bounds_orders_its_references() -> None:
    prompts = [A, AX, B, A, AX, B, A8, AX]
    b = cell_bounds(prompts, 2, 4, BS, 1.3)
    assert b["at_target"]["hit_rate"] <= b["infinite"]["hit_rate"]
    assert b["opt"]["hit_rate"] <= b["infinite"]["hit_rate"]
    assert b["ceiling"]["hit_rate"] <= b["opt"]["hit_rate"]
    assert b["at_target"]["cap"] == 5 and b["target"] == 1.3
