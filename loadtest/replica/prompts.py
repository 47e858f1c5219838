"""From a parsed request to prompt token ids and block hashes, memoised per request body.

Chat messages are rendered with the chat template and tokenised; completion prompts are
tokenised as they are (or taken as token ids). The result — ids, chained full-block hashes and
the seed of the deterministic reply — depends only on the request body, so an LRU keyed by a
128-bit hash of the body skips rendering, tokenising and hashing when a body repeats (load
generators replay bodies). Templates that read the clock (``strftime_now``) are never memoised.
Cost: O(prompt) on a miss, O(body bytes) to hash on a hit; memory bounded by ``memo_tokens``
token ids (plus their block hashes) in all.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import xxhash

from templates_audit.blocks import block_hashes
from templates_audit.render import ChatRenderer
from templates_audit.tokenize import Tokenizer

from .openai_api import Job, Kind
from .text import prompt_seed


@dataclass(frozen=True)
class Prompt:
    ids: tuple[int, ...]
    hashes: tuple[int, ...]
    seed: int


class Prompter:
    def __init__(self, renderer: ChatRenderer, tokenizer: Tokenizer, block_size: int,
                 memo_tokens: int = 1 << 21) -> None:
        self.renderer = renderer
        self.tokenizer = tokenizer
        self.block_size = block_size
        self._memo: OrderedDict[bytes, Prompt] = OrderedDict()
        self._memo_budget = memo_tokens if "strftime_now" not in renderer.source else 0
        self._memo_used = 0
        self._piece_ids: dict[str, tuple[int, ...]] = {}

    def ids(self, job: Job) -> list[int]:
        if job.kind is Kind.CHAT:
            text = self.renderer.render(list(job.messages), list(job.tools) if job.tools else None,
                                        True, **(job.template_kwargs or {}))
            return self.tokenizer.encode(text)
        if job.prompt_ids is not None:
            return list(job.prompt_ids)
        return self.tokenizer.encode(job.prompt_text or "")

    def prompt(self, job: Job, body: bytes) -> Prompt:
        key = xxhash.xxh3_128_digest(body)
        hit = self._memo.get(key)
        if hit is not None:
            self._memo.move_to_end(key)
            return hit
        ids = self.ids(job)
        hashes = block_hashes(ids, self.block_size)
        # The chained hashes already summarise the full blocks; only the tail needs hashing.
        tail = ids[len(hashes) * self.block_size:]
        out = Prompt(tuple(ids), tuple(hashes), prompt_seed(tail, hashes[-1] if hashes else 0))
        if len(ids) <= self._memo_budget:
            self._memo[key] = out
            self._memo_used += len(ids)
            while self._memo_used > self._memo_budget:
                self._memo_used -= len(self._memo.popitem(last=False)[1].ids)
        return out

    def reply_ids(self, pieces: list[str]) -> list[int]:
        """Token ids of the reply, piece by piece (the pieces come from a small vocabulary)."""
        out: list[int] = []
        for piece in pieces:
            ids = self._piece_ids.get(piece)
            if ids is None:
                ids = self._piece_ids[piece] = tuple(self.tokenizer.encode(piece))
            out.extend(ids)
        return out
