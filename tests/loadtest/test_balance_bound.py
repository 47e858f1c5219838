"""Offline balance bounds of whole conversations (`loadtest.balance_bound`)."""

from __future__ import annotations

import pytest

from loadtest.balance_bound import Conversation, copy_greedy, lower_bound, lpt


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
