"""Deterministic reply text: the batched completion_pieces equals token_text token by token."""

from __future__ import annotations

import random

from loadtest.replica.text import completion_pieces, token_text


def test_completion_pieces_are_token_texts() -> None:
    rng = random.Random(2)
    for n in (0, 1, 2, 16, 63, 64, 65, 130):
        seed = rng.getrandbits(64)
        pieces = completion_pieces(seed, n)
        assert pieces == [token_text(seed, i) for i in range(n)]
        assert all(p.startswith(" ") == (i > 0) for i, p in enumerate(pieces))
