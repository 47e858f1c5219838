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

`opt_bound` is the rigorous counterpart of the ceiling: Belady's optimal eviction instead of LRU
over the same block accesses, an upper bound on the hits of any router (its docstring has the
argument).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from templates_audit.blocks import PrefixCache

__all__ = ["Ceiling", "HitRate", "Prompt", "fits", "fleet_ceiling", "opt_bound", "replay", "request_prompts"]

Prompt = tuple[Sequence[int], int]  # (full-block hashes, prompt tokens)


class HitRate:
    """For the result dataclasses of hit counts (`Ceiling`, `loadtest.balance_bound.HitBound`):
    the hit rate in tokens and the JSON of every field plus ``hit_rate``."""

    hit_tokens: int
    query_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "hit_rate": self.hit_rate}  # type: ignore[call-overload]  # subclasses are dataclasses


@dataclass(frozen=True)
class Ceiling(HitRate):
    requests: int  # prompts replayed (those that fit one replica's pool)
    hit_tokens: int
    query_tokens: int
    num_blocks: int | None  # the one cache's size (None: unbounded)
    block_size: int


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


def opt_bound(prompts: Iterable[Prompt], num_blocks: int | None,
              block_size: int = 16) -> Ceiling:
    """An upper bound on the prefix-cache hits of ANY routing of ``prompts`` over replicas whose
    KV pools total ``num_blocks`` blocks: Belady's MIN with bypass over their block accesses.

    Argument. Take a fleet of N replicas of K blocks (N x K = ``num_blocks``) and any router.
    Mirror the fleet in one cache M that holds, at every moment, the union of the replicas'
    cached blocks: at most N x K blocks. A replica adds a block only while it serves a request
    whose full blocks contain it, so M can add it at that request's access to the block; a
    replica evicts, M drops the block when no replica holds it any more. A fleet hit on block
    b of a request is b cached on the replica the request landed on, so b is in M at that
    access: fleet hits <= M's hits, counted per block access. M is a cache of ``num_blocks``
    pages that loads a page only when it is accessed (or skips it) and evicts at will; over
    a known sequence none has more hits than Belady's MIN with bypass (on a miss with a full
    cache, evict the resident page whose next use is furthest in the future - or skip the new
    page if its own next use is later still). So the page hits of MIN over the sequence of
    every request's full blocks, in arrival order, bound every router's hits from above; in
    tokens, x ``block_size``, over the same prompt tokens as vLLM's queries.

    Generous on purpose (each only raises the bound): a prefix hit needs every earlier block of
    the request, a page hit only its own block; a request's blocks need not be resident
    together (nor its partial last block, its generated tokens, the running requests' blocks);
    every full block counts as a possible hit, while vLLM never hits the block holding a
    prompt's last token (the last full block of a prompt of a multiple of ``block_size``
    tokens). That block stays in the sequence because a request caches it: a later, longer
    prompt can hit it, and leaving it out would let that hit escape the bound.

    Assumptions: the replicas look blocks up in arrival order (exactly so for requests served
    one at a time, as `replay` assumes; a fleet whose queues reorder requests across replicas
    changes the sequence, which this bound does not cover), and no prompt hits a block cached
    from generated tokens (the workloads resend their own text, not the replica's reply).
    ``num_blocks=None`` is an unbounded cache: every access after a block's first is a hit.

    Cost: O(B log K) time for B block accesses and a cache of K blocks (next uses precomputed
    in one backward pass; a max-heap of resident next uses with lazy deletion, rebuilt when
    stale entries outnumber the live ones), O(B) memory.
    """
    seq: list[int] = []
    n = queries = 0
    for hashes, tokens in prompts:
        seq.extend(hashes)
        n += 1
        queries += tokens
    never = len(seq)  # "next use" of a last access: later than every index
    nxt = [never] * len(seq)
    last: dict[int, int] = {}
    for i in range(len(seq) - 1, -1, -1):
        b = seq[i]
        nxt[i] = last.get(b, never)
        last[b] = i
    cache: dict[int, int] = {}  # resident block -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, block); stale when cache[block] differs
    cap = num_blocks
    hits = 0
    for i, b in enumerate(seq):
        nu = nxt[i]
        if b in cache:
            hits += 1
        elif nu == never or cap == 0:
            continue  # never used again (or no room at all): skip it
        elif cap is not None and len(cache) >= cap:
            while True:  # the live resident used furthest in the future
                neg, v = heap[0]
                if cache.get(v) == -neg:
                    break
                heapq.heappop(heap)
            if -neg <= nu:
                continue  # every resident is used before b: skip b
            heapq.heappop(heap)
            del cache[v]
        cache[b] = nu
        heapq.heappush(heap, (-nu, b))
        if len(heap) > 2 * len(cache) + 64:  # drop the stale entries: the heap stays O(K)
            heap = [(-u, v) for v, u in cache.items()]
            heapq.heapify(heap)
    return Ceiling(n, hits * block_size, queries, num_blocks, block_size)
