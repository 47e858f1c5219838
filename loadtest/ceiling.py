"""The one-cache ceiling: the hit rate of a fleet's requests served by one cache of its total size.

A router places each request on one replica; the best it can do is what a single vLLM cache
holding the whole fleet's KV capacity would do with the same requests. `replay` serves the
prompts one after the other, in arrival order, through one `templates_audit.blocks.PrefixCache`
of ``replicas x kv_blocks`` blocks - the block math the simulated replica and the auditor share
(full blocks only, chained hashes, the last prompt token never a hit, LRU eviction of unpinned
blocks, tail blocks first) - and counts hits and queries in tokens, as vLLM's counters do. The
fleet's hit rate over the same requests (``vllm:prefix_cache_hits_total`` /
``vllm:prefix_cache_queries_total``) divided by this one is the fraction of the reachable reuse
a router achieved.

What the ceiling assumes, and why it is the reference rather than a proof of optimality:

* no concurrency: every request finishes before the next starts, so nothing is pinned and a
  request always finds the blocks of the one before it (on a busy fleet two requests of one
  prefix can run at once and the second misses the blocks the first is still computing);
* no fragmentation: one pool, so a prefix is never computed on two replicas;
* prompts only: generated tokens are not cached. The workloads resend their own assistant
  text, not the replica's reply, so those blocks are never hit; leaving them out only makes
  the ceiling more generous;
* LRU, as vLLM: not Belady's optimal eviction, so a router that partitions prefixes across
  replicas can in principle beat it slightly on a cyclic pattern larger than the pool.

`request_prompts` turns load-test requests into (hashes, tokens) with the simulated replica's own
`Prompter` (chat template, tokeniser, block hashes), so the ceiling counts exactly the tokens and
blocks the fleet counts. A request that does not fit one replica's pool (prompt + ``max_tokens``,
the engine's admission check) is skipped, as a replica refuses it (HTTP 400) and counts nothing.

Cost: one render + tokenise + hash per request (memoised per shared message prefix, as in the
replica) and O(blocks) per request for the replay; memory O(total blocks).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from templates_audit.blocks import PrefixCache

__all__ = ["Ceiling", "fits", "fleet_ceiling", "replay", "request_prompts"]

Prompt = tuple[Sequence[int], int]  # (full-block hashes, prompt tokens)


@dataclass(frozen=True)
class Ceiling:
    requests: int  # prompts replayed (those that fit one replica's pool)
    hit_tokens: int
    query_tokens: int
    num_blocks: int | None  # the one cache's size (None: unbounded)
    block_size: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "hit_tokens": self.hit_tokens,
                "query_tokens": self.query_tokens, "num_blocks": self.num_blocks,
                "block_size": self.block_size, "hit_rate": self.hit_rate}


def replay(prompts: Iterable[Prompt], num_blocks: int | None, block_size: int) -> Ceiling:
    """Serve ``prompts`` in order through one cache of ``num_blocks`` blocks (None: unbounded)."""
    cache = PrefixCache(num_blocks, block_size)
    n = 0
    for hashes, tokens in prompts:
        cache.insert(hashes, tokens)
        n += 1
    return Ceiling(n, cache.hits, cache.queries, num_blocks, block_size)


def fits(prompt_tokens: int, max_tokens: int, kv_blocks: int | None, block_size: int) -> bool:
    """Whether one replica of ``kv_blocks`` admits the request (the engine's check)."""
    return kv_blocks is None or -(-(prompt_tokens + max_tokens) // block_size) <= kv_blocks


def request_prompts(requests: Iterable[Any], block_size: int = 16,
                    kv_blocks: int | None = None,
                    tokenizer: str | None = None) -> Iterator[Prompt]:
    """(hashes, tokens) of load-test requests (`loadtest.workloads.Request`: ``path`` and
    ``body``) in arrival order, as the simulated replica computes them - with its default
    template and tokeniser, or with a model's ``tokenizer`` (a ``tokenizer.json`` or its
    directory, and the chat template of its ``tokenizer_config.json``: a real vLLM's prompts);
    those one replica of ``kv_blocks`` would refuse are left out."""
    from loadtest.replica import openai_api
    from loadtest.replica.prompts import Prompter, renderer_for
    from templates_audit.tokenize import load_tokenizer

    tok = load_tokenizer(tokenizer)
    prompter = Prompter(renderer_for(tok), tok, block_size)
    for r in sorted(requests, key=lambda r: r.at):
        parse = (openai_api.parse_completion if r.path.endswith("/completions")
                 and "chat" not in r.path else openai_api.parse_chat)
        job = parse(r.body, 16)
        p = prompter.prompt(job, r.json_bytes())
        if fits(len(p.ids), job.max_tokens, kv_blocks, block_size):
            yield p.hashes, len(p.ids)


def fleet_ceiling(requests: Sequence[Any], replicas: int, kv_blocks: int,
                  block_size: int = 16, tokenizer: str | None = None) -> Ceiling:
    """The ceiling of ``requests`` on a fleet of ``replicas`` x ``kv_blocks`` blocks."""
    return replay(request_prompts(requests, block_size, kv_blocks, tokenizer),
                  replicas * kv_blocks, block_size)
