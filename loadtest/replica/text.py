"""Deterministic completion text.

Token i of a completion is a short word picked by hashing (seed, i), where the seed is derived from the
prompt's token ids: the same prompt always yields the same text, different prompts differ, and
no randomness state is shared between requests. O(1) per token.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import xxhash

_WORDS = (  # at most five letters: " word" is one token for the default tokenizer
    "the", "cache", "block", "warm", "cold", "hit", "miss", "token", "batch", "queue", "model",
    "fleet", "hash", "ring", "load", "spill", "home", "chunk", "step", "route", "reply", "keep",
    "fast", "slow", "path", "node", "pool", "page", "tile", "lane", "gate", "turn",
)


def prompt_seed(token_ids: Sequence[int], parent: int = 0) -> int:
    """A hash of the prompt; `parent` lets a caller pass the chained hash of its leading blocks."""
    return xxhash.xxh3_64_intdigest(array("q", token_ids).tobytes(), seed=parent)


def token_text(seed: int, index: int) -> str:
    word = _WORDS[xxhash.xxh64_intdigest(index.to_bytes(8, "little"), seed=seed) % len(_WORDS)]
    return word if index == 0 else " " + word


def completion_pieces(seed: int, num_tokens: int) -> list[str]:
    """The completion's text, one piece per token (what each stream chunk carries)."""
    return [token_text(seed, i) for i in range(num_tokens)]
