"""What the choice of replica alone can do to a fleet's hit rate when evictions decide.

A router decides only *where* each request runs; every replica then caches and evicts as vLLM
does (LRU over its free queue, a request's tail blocks first). `replay_fleet` serves prompts in
arrival order, one after the other, each on the replica an assignment names, through one
`templates_audit.blocks.PrefixCache` per replica - the block math of the simulated replica and of
`loadtest.ceiling.replay` (that is this with one replica of the whole capacity) - and counts hits
and queries in tokens as vLLM's counters do. No timing: nothing runs concurrently, so nothing is
pinned, and load does not matter; what is left is placement against eviction.

Two ways to choose the assignment:

* `route_online`: a policy sees what a precise router sees - every replica's cached blocks and
  the requests placed so far - and the current request, never a later one. `POLICIES` holds the
  ones compared: ``precise`` (longest cached prefix; a cold request to the replica with the
  fewest requests: the precise index with a balanced cold path), ``home`` (a fixed partition:
  the prefix's first block modulo the replicas), ``quiet-head`` (a cold request to the replica
  whose next evictions hold the fewest blocks that two earlier requests held - prefixes that
  have come back, the evictions likeliest to cost a hit), ``sacrificial:A`` (one replica takes
  the cold requests except a fraction ``A`` admitted to the others: vLLM's LRU cannot skip a
  block, a router can send it where it does the least harm).
* `search_partition`: a hill climb over group -> replica maps scored by `replay_fleet` over the
  run itself, so it uses the run's future (clairvoyant); the partition it finds is the best
  *static* placement it could find for that one sequence. `transplant` scores the same map
  (group index -> replica) on another seed's requests, where it knows nothing.

With uniform popularity the next request's group does not depend on the past, so what an
online router can gain over the LRU ceiling is limited to where the eviction of each new
prefix falls; a clairvoyant placement can also keep the groups that happen to return soon.
``python -m loadtest.placement`` prints both on the cache-pressure cell of `loadtest.bench_kv`
(docs/kv-events.md has the numbers).

Cost: `replay_fleet` O(blocks) per request; ``quiet-head`` adds O(R x window) per cold request;
`search_partition` one replay per step.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from loadtest.balance_bound import lpt_assign
from loadtest.ceiling import Ceiling, Prompt
from templates_audit.blocks import PrefixCache

__all__ = ["POLICIES", "Fleet", "cell_prompts", "main", "replay_fleet", "route_online",
           "search_partition", "transplant"]


@dataclass
class Fleet:
    """Per-replica pools and what a router has placed so far (what a policy may read)."""
    pools: list[PrefixCache]
    placed: list[int]                                # requests per replica
    seen: set[int] = field(default_factory=set)      # block hashes of the earlier requests
    shared: set[int] = field(default_factory=set)    # ... held by two or more of them

    def record(self, prompt: Prompt) -> None:
        """Note a placed prompt's blocks: a block seen a second time is shared."""
        for h in set(prompt[0]):
            (self.shared if h in self.seen else self.seen).add(h)

    def cached(self, r: int, prompt: Prompt) -> int:
        """Prompt tokens replica ``r`` would take from its cache."""
        return self.pools[r].cached_prefix_tokens(*prompt)

    def head_value(self, r: int, window: int) -> int:
        """Blocks two earlier requests held (a prefix that has come back once), among the next
        ``window`` blocks replica ``r`` would evict."""
        return sum(h is not None and h in self.shared for h in self.pools[r].next_evictions(window))


Policy = Callable[[Fleet, Prompt, random.Random], int]


def _best_hit(f: Fleet, prompt: Prompt) -> tuple[int, int]:
    hits = [f.cached(r, prompt) for r in range(len(f.pools))]
    best = max(range(len(hits)), key=lambda r: (hits[r], -f.placed[r]))
    return best, hits[best]


def _precise(f: Fleet, prompt: Prompt, rng: random.Random) -> int:
    return _best_hit(f, prompt)[0]


def _home(f: Fleet, prompt: Prompt, rng: random.Random) -> int:
    hashes = prompt[0]
    return (hashes[0] if hashes else 0) % len(f.pools)


def _quiet_head(f: Fleet, prompt: Prompt, rng: random.Random) -> int:
    best, hit = _best_hit(f, prompt)
    if hit:
        return best
    window = f.pools[0].blocks_for(prompt[1])
    return min(range(len(f.pools)), key=lambda r: (f.head_value(r, window), f.placed[r]))


def _sacrificial(admit: float) -> Policy:
    def policy(f: Fleet, prompt: Prompt, rng: random.Random) -> int:
        best, hit = _best_hit(f, prompt)
        if hit:
            return best
        last = len(f.pools) - 1
        if last and rng.random() < admit:
            return min(range(last), key=lambda r: f.placed[r])
        return last
    return policy


POLICIES: dict[str, Policy] = {"precise": _precise, "home": _home, "quiet-head": _quiet_head,
                               "sacrificial:0.3": _sacrificial(0.3),
                               "sacrificial:0.6": _sacrificial(0.6)}


def replay_fleet(prompts: Sequence[Prompt], assign: Sequence[int], replicas: int,
                 kv_blocks: int, block_size: int = 16) -> Ceiling:
    """Serve ``prompts[i]`` on replica ``assign[i]``, in order; the fleet's hits and queries."""
    if len(assign) != len(prompts):
        raise ValueError(f"{len(assign)} replicas assigned for {len(prompts)} prompts")
    if any(not 0 <= r < replicas for r in assign):
        raise ValueError(f"an assigned replica is outside 0..{replicas - 1}")
    pools = [PrefixCache(kv_blocks, block_size) for _ in range(replicas)]
    for (hashes, tokens), r in zip(prompts, assign, strict=True):
        pools[r].insert(hashes, tokens)
    return _result(pools, len(prompts), kv_blocks, block_size)


def _result(pools: Sequence[PrefixCache], requests: int, kv_blocks: int,
            block_size: int) -> Ceiling:
    return Ceiling(requests, sum(p.hits for p in pools), sum(p.queries for p in pools),
                   len(pools) * kv_blocks, block_size)


def route_online(prompts: Sequence[Prompt], policy: Policy, replicas: int, kv_blocks: int,
                 block_size: int = 16, seed: int = 0) -> tuple[Ceiling, list[int]]:
    """Place each prompt by ``policy`` (which sees the pools, the earlier prompts and the current
    one, never a later one), serve it there; the fleet's result and the assignment."""
    f = Fleet([PrefixCache(kv_blocks, block_size) for _ in range(replicas)], [0] * replicas)
    rng = random.Random(seed)
    assign = []
    for prompt in prompts:
        r = policy(f, prompt, rng)
        f.pools[r].insert(*prompt)
        f.placed[r] += 1
        f.record(prompt)
        assign.append(r)
    return _result(f.pools, len(prompts), kv_blocks, block_size), assign


def search_partition(prompts: Sequence[Prompt], groups: Sequence[int], replicas: int,
                     kv_blocks: int, steps: int, seed: int = 0, block_size: int = 16,
                     num_groups: int | None = None) -> tuple[float, list[int]]:
    """Hill climb over static partitions (group index -> replica) scored by the hit rate of
    ``prompts`` themselves: start from the balanced partition (groups by request count, largest
    first onto the replica with the fewest requests), then ``steps`` times move one or two
    random groups to random replicas and keep the move if the hit rate does not drop. Returns
    the best hit rate and map (``num_groups`` entries, default ``max(groups) + 1``, so that it
    can be transplanted to requests of groups these lack); never below the start."""
    n = max(num_groups or 0, max(groups, default=-1) + 1)
    if not n:
        return 0.0, []
    count = [0] * n
    for g in groups:
        count[g] += 1
    best_map = lpt_assign(count, replicas)
    best = transplant(prompts, groups, best_map, replicas, kv_blocks, block_size)
    rng = random.Random(seed)
    for _ in range(steps):
        m = list(best_map)
        for _ in range(rng.choice((1, 1, 2))):
            m[rng.randrange(n)] = rng.randrange(replicas)
        v = transplant(prompts, groups, m, replicas, kv_blocks, block_size)
        if v >= best:
            best, best_map = v, m
    return best, best_map


def transplant(prompts: Sequence[Prompt], groups: Sequence[int], partition: Sequence[int],
               replicas: int, kv_blocks: int, block_size: int = 16) -> float:
    """The hit rate of a fixed partition (group index -> replica) on other requests."""
    return replay_fleet(prompts, [partition[g] for g in groups], replicas, kv_blocks,
                        block_size).hit_rate


def cell_prompts(requests: int, seed: int,
                 groups: int | None = None) -> tuple[list[Prompt], list[int]]:
    """The cache-pressure cell of `loadtest.bench_kv` (``requests`` of them at ``seed``; with
    ``groups`` system prompts instead of its 75) as prompts, and each one's group: the
    workload's system prompt index."""
    from loadtest.bench_kv import CACHE_PRESSURE
    from loadtest.ceiling import request_prompts
    from loadtest.cells import cell_requests

    w = replace(CACHE_PRESSURE, requests=requests)
    if groups is not None:
        w = replace(w, spec={**w.spec, "prompts": groups})
    with tempfile.TemporaryDirectory(prefix="placement-") as tmp:
        reqs, _ = cell_requests(w, seed, Path(tmp))
    reqs = sorted(reqs, key=lambda r: r.at)
    prompts = list(request_prompts(reqs, w.fleet.block_size, w.fleet.kv_blocks))
    if len(prompts) != len(reqs):
        raise ValueError("a request does not fit one replica: groups would not line up")
    return prompts, [int(r.group.lstrip("p")) for r in reqs]


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return n


def main(argv: list[str] | None = None) -> int:
    from loadtest.bench_kv import CACHE_PRESSURE
    from loadtest.ceiling import opt_bound, replay

    ap = argparse.ArgumentParser(prog="python -m loadtest.placement", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=_positive, default=3 * CACHE_PRESSURE.requests)
    ap.add_argument("--seeds", default=[0, 1, 2, 3, 4, 5, 6, 7], type=_seeds,
                    help="comma-separated seeds the policies run on (default 0-7)")
    ap.add_argument("--search-seed", type=int, default=2026,
                    help="the seed the clairvoyant search fits (bench_kv's default)")
    ap.add_argument("--steps", type=_positive, default=2000, help="hill-climb steps")
    ap.add_argument("--replicas", type=_positive, default=CACHE_PRESSURE.fleet.replicas,
                    help="replicas of the cell's KV capacity each (llm-d's scale: 8 with "
                         "--groups 150 --requests 2000, the --simulate cells of bench_kv)")
    ap.add_argument("--groups", type=_positive, default=CACHE_PRESSURE.spec["prompts"],
                    help="system prompts (groups) of the cell")
    args = ap.parse_args(argv)
    f = CACHE_PRESSURE.fleet
    n, kv = args.replicas, f.kv_blocks
    assert kv is not None
    seeds = args.seeds
    print(f"cache-pressure, {args.requests} requests of {args.groups} groups, {n} replicas x "
          f"{kv} blocks; hit rate in % "
          "of prompt tokens, sequential (no timing)\n")
    prompts, groups = cell_prompts(args.requests, args.search_seed, args.groups)
    lru = replay(prompts, n * kv, f.block_size).hit_rate
    found, part = search_partition(prompts, groups, n, kv, args.steps,
                                   block_size=f.block_size, num_groups=args.groups)
    print(f"seed {args.search_seed}: LRU ceiling {100 * lru:.2f}, OPT bound "
          f"{100 * opt_bound(prompts, n * kv, f.block_size).hit_rate:.2f}, clairvoyant "
          f"partition ({args.steps} steps) {100 * found:.2f}\n")
    rows: dict[str, list[float]] = {name: [] for name in [*POLICIES, "clairvoyant partition, "
                                                          "transplanted"]}
    print("| seed | LRU ceiling | " + " | ".join(rows) + " |")
    print("|---|---|" + "---|" * len(rows))
    for seed in seeds:
        ps, gs = cell_prompts(args.requests, seed, args.groups)
        ceiling = replay(ps, n * kv, f.block_size).hit_rate
        cells = []
        for name, policy in POLICIES.items():
            v = route_online(ps, policy, n, kv, f.block_size, seed)[0].hit_rate
            rows[name].append(v - ceiling)
            cells.append(100 * v)
        v = transplant(ps, gs, part, n, kv, f.block_size)
        rows["clairvoyant partition, transplanted"].append(v - ceiling)
        cells.append(100 * v)
        print(f"| {seed} | {100 * ceiling:.2f} | " + " | ".join(f"{c:.2f}" for c in cells) + " |",
              flush=True)
    print("| mean vs ceiling | | " + " | ".join(
        f"{100 * statistics.mean(v):+.2f} ({100 * min(v):+.2f}..{100 * max(v):+.2f})"
        for v in rows.values()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
