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


_SPACED = tuple(" " + w for w in _WORDS)
REPLY_VOCABULARY = _WORDS + _SPACED   # every piece a reply can hold
_INDEX = [i.to_bytes(8, "little") for i in range(64)]   # the hashed bytes of small indices


def _index_bytes(index: int) -> bytes:
    return _INDEX[index] if index < len(_INDEX) else index.to_bytes(8, "little")


def token_text(seed: int, index: int) -> str:
    k = xxhash.xxh64_intdigest(_index_bytes(index), seed=seed) % len(_WORDS)
    return _WORDS[k] if index == 0 else _SPACED[k]


def completion_pieces(seed: int, num_tokens: int) -> list[str]:
    """The completion's text, one piece per token (what each stream chunk carries)."""
    if num_tokens <= 0:
        return []
    if num_tokens > len(_INDEX):
        return [token_text(seed, i) for i in range(num_tokens)]
    digest, n = xxhash.xxh64_intdigest, len(_WORDS)
    out = [_SPACED[digest(b, seed=seed) % n] for b in _INDEX[:num_tokens]]
    out[0] = out[0][1:]   # the first token has no leading space
    return out
