"""How evenly a cell's requests *can* be spread without moving a conversation: offline bounds.

A router that keeps every conversation on one replica (its history is cached there; moving a
later turn re-prefills the whole history) places *conversations*, not requests. Known the whole
run in advance, the most even placement of conversations of request counts ``s_1 .. s_k`` on
``n`` equal replicas still has max/mean requests per replica of at least

    lower bound = max(max_i s_i, total / n) / (total / n)

(the largest conversation sits somewhere whole; and some replica holds at least the mean), and
`lpt` reaches at most 4/3 of the optimum (Graham's longest-processing-time-first rule: the
largest conversation next onto the least loaded replica). A cell whose lower bound is above a
target cannot meet it without moving follow-ups off their history, whatever the router.

`copy_greedy` also counts what an even placement costs in *prefix copies*: conversations of one
prompt group (a system prompt, a mooncake trace's first block) share that prefix, so every
extra replica a group is spread onto pays one cold prefill of it. Largest conversation first,
each goes to the least loaded replica already holding its group whose count stays within the
cap (``target`` x the mean), else to the least loaded replica within the cap (a copy), else to
the least loaded replica (the cap cannot hold). The copied tokens over the cell's prompt tokens
estimate the hit rate the balance costs (offline: no arrival order, no eviction).

`hit_bound` bounds the other side of the trade: the best hit rate ANY router can reach while
no replica receives more than ``target`` x the mean number of requests (its docstring has the
argument); with `loadtest.ceiling.opt_bound` (Belady's optimal eviction, capacity-aware) it
says when issue #18's two targets (hit rate >= sglang-router's, max/mean <= 1.3) cannot be met
together on a cell, whatever the router.

Pure; cost O(k log k + k n) for k conversations on n replicas, O(B) for `hit_bound` over B
block accesses. ``python -m loadtest.balance_bound`` prints the tables for the `make bench`
cells (and the hit bounds of the 64-replica simulation and the cache-pressure cells).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.ceiling import HitRate

__all__ = ["Conversation", "HitBound", "Placement", "cell_bounds", "cell_conversations",
           "copy_greedy", "hit_bound", "lower_bound", "lpt", "lpt_assign"]


@dataclass(frozen=True)
class Conversation:
    group: str  # the prompt group whose prefix it shares
    requests: int
    prefix_tokens: int = 0  # tokens of the group's shared prefix (one cold prefill per copy)


@dataclass(frozen=True)
class Placement:
    max_over_mean: float
    copies: int  # replicas a group was placed on beyond its first
    copy_tokens: int  # prefix tokens those copies prefill cold


@dataclass(frozen=True)
class HitBound(HitRate):
    """`hit_bound`'s result: at most ``hit_tokens`` of ``query_tokens`` are hits."""

    requests: int  # prompts counted (those a replica admits)
    hit_tokens: int
    query_tokens: int
    cap: int | None  # requests per replica at most (None: no balance constraint)
    block_size: int


def hit_bound(prompts: Iterable[tuple[Sequence[int], int]], replicas: int,
              target: float | None, block_size: int = 16,
              requests: int | None = None) -> HitBound:
    """An upper bound on the prefix-cache hits of ANY router that sends at most ``target`` x
    the mean requests to each of ``replicas`` replicas, from the requests alone
    (``prompts``: `loadtest.ceiling.request_prompts`, (full-block hashes, prompt tokens) in
    arrival order).

    Argument. Max/mean <= ``target`` means every replica receives at most C = floor(target x
    requests / replicas) requests (``requests``: every request the router places and the load
    counts; default the prompts given). A request may hit block b only where b is among its
    hit-eligible blocks, the first (tokens - 1) // block_size full ones (vLLM always computes
    the last prompt token), and only on a replica that cached b before. Say b is eligible in
    R_b requests, O_b times in all (O_b = R_b unless a hash repeats within a request). They
    land on at least k_b = ceil(R_b / C) replicas (1 without a cap). On each of those, the
    first request that holds b at all finds it uncached: it is either one of the R_b, whose
    first eligible b misses, or a request that holds b only as its non-eligible last full block
    (a prompt of a multiple of ``block_size`` tokens caches that block without being able to
    hit it); there are W_b of those, and each is on one replica. So at least k_b - W_b of the
    O_b eligible occurrences miss, and

        fleet hit tokens <= block_size x sum over b of (O_b - max(0, k_b - W_b)).

    Over the prompt tokens (vLLM's queries) it is the best hit rate any router reaches at that
    balance. ``target=None`` is the unbounded one-cache hit rate (``replay(prompts, None)``:
    with chained hashes a cached block's prefix is cached too, so one unbounded cache hits
    every eligible block it saw before), except that a W_b request counts as warming b even
    when it arrives after b's first eligible request (the bound ignores order). A ``target``
    whose cap cannot hold the requests (C x replicas < requests) admits no placement at all:
    the bound is 0.

    Assumptions: a block is cached on a replica only by a request served there (no prompt hits
    a block of generated tokens: the workloads resend their own text, not the replica's reply;
    nothing is copied between replicas). Generous on purpose (each only raises the bound):
    capacity and eviction are ignored, blocks are counted independently (a hit on b needs the
    blocks before it too) and every replica may hold any mix of prefixes.

    Cost: O(B) time and memory for B block accesses (a few dictionary counts per block).
    """
    occurrences: Counter[int] = Counter()  # O_b: eligible occurrences
    eligible: Counter[int] = Counter()  # R_b: requests holding b among their eligible blocks
    warm: Counter[int] = Counter()  # W_b: requests holding b only past them
    n = queries = 0
    for hashes, tokens in prompts:
        n += 1
        queries += tokens
        k = min(len(hashes), max(0, (tokens - 1) // block_size))
        head = hashes[:k]
        occurrences.update(head)
        seen = set(head)
        eligible.update(seen)
        if len(hashes) > k:
            warm.update(set(hashes[k:]) - seen)
    total = n if requests is None else requests
    cap = None if target is None else math.floor(target * total / replicas + 1e-9)
    if cap is not None and cap * replicas < total:
        return HitBound(n, 0, queries, cap, block_size)
    hits = 0
    for b, o in occurrences.items():
        need = 1 if cap is None else -(-eligible[b] // cap)
        hits += o - max(0, need - warm[b])
    return HitBound(n, hits * block_size, queries, cap, block_size)


def lower_bound(sizes: Sequence[int], replicas: int) -> float:
    """max(largest conversation, total / n) over the mean: no placement of whole
    conversations does better."""
    total = sum(sizes)
    if not total or replicas < 1:
        return 1.0
    mean = total / replicas
    return max(max(sizes), mean) / mean


def lpt_assign(sizes: Sequence[int], replicas: int) -> list[int]:
    """Longest processing time first: item by item, largest first (ties in index order), onto
    the replica with the least so far (ties: the lowest); the replica of each item. O(n log n +
    n x replicas)."""
    loads = [0] * replicas
    where = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        r = loads.index(min(loads))
        where[i] = r
        loads[r] += sizes[i]
    return where


def lpt(sizes: Sequence[int], replicas: int) -> float:
    """max/mean of the longest-processing-time-first placement (within 4/3 of the optimum)."""
    total = sum(sizes)
    if not total or replicas < 1:
        return 1.0
    loads = [0] * replicas
    for s, r in zip(sizes, lpt_assign(sizes, replicas), strict=True):
        loads[r] += s
    return max(loads) / (total / replicas)


def copy_greedy(conversations: Sequence[Conversation], replicas: int,
                target: float) -> Placement:
    """The placement of the module docstring: within ``target`` x the mean where possible,
    copying a group's prefix onto another replica only when its holders are full."""
    total = sum(c.requests for c in conversations)
    if not total or replicas < 1:
        return Placement(1.0, 0, 0)
    cap = target * total / replicas
    loads = [0] * replicas
    holders: dict[str, set[int]] = {}
    copies = copy_tokens = 0
    for c in sorted(conversations, key=lambda c: c.requests, reverse=True):
        held = holders.setdefault(c.group, set())
        fits = [i for i in range(replicas) if loads[i] + c.requests <= cap]
        home = [i for i in fits if i in held]
        pool = home or fits or list(range(replicas))
        i = min(pool, key=lambda j: (loads[j], j))
        if held and i not in held:
            copies += 1
            copy_tokens += c.prefix_tokens
        held.add(i)
        loads[i] += c.requests
    return Placement(max(loads) / (total / replicas), copies, copy_tokens)


def cell_bounds(prompts: Iterable[tuple[Sequence[int], int]], replicas: int,
                kv_blocks: int | None, block_size: int = 16, target: float = 1.3,
                requests: int | None = None) -> dict[str, Any]:
    """The hit-rate references of one cell, from its prompts (`loadtest.ceiling.request_prompts`):
    ``ceiling`` (one LRU cache of the fleet's capacity: a reference, not a bound),
    ``infinite`` (`hit_bound` without a balance cap), ``at_target`` (`hit_bound` at max/mean
    <= ``target``) and ``opt`` (`loadtest.ceiling.opt_bound` over ``replicas`` x
    ``kv_blocks`` blocks); each the JSON of its result (``hit_rate`` among the keys)."""
    from loadtest.ceiling import opt_bound, replay

    ps = list(prompts)
    size = None if kv_blocks is None else replicas * kv_blocks
    return {"target": target,
            "ceiling": replay(ps, size, block_size).to_json(),
            "infinite": hit_bound(ps, replicas, None, block_size, requests).to_json(),
            "at_target": hit_bound(ps, replicas, target, block_size, requests).to_json(),
            "opt": opt_bound(ps, size, block_size).to_json()}


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def cell_conversations(name: str, replicas: int, seed: int) -> tuple[list[Conversation], int]:
    """The conversations of `make bench` cell ``name`` at ``replicas`` (`loadtest.cells`) and
    the cell's prompt tokens. A request without a conversation (a single turn) is its own; a
    mooncake conversation is the records sharing their second block id (as
    `loadtest.cells.mooncake_slice` takes them). Prefix tokens are the longest prefix common to
    a group's prompts, tokenised as the simulator does."""
    from loadtest.cells import WORKLOADS, cell_requests
    from loadtest.simulate import _sim_requests

    w = next(w for w in WORKLOADS if w.name == name).at(replicas)
    with tempfile.TemporaryDirectory(prefix="bound-") as tmp:
        reqs, _meta = cell_requests(w, seed, Path(tmp))
        slice_path = Path(tmp) / "slice.jsonl"  # the mooncake slice `cell_requests` wrote
        trace = ([json.loads(line) for line in slice_path.read_text().splitlines() if line]
                 if w.max_input_tokens and slice_path.exists() else None)
    sim = _sim_requests(reqs)
    counts: dict[tuple[str, str], int] = {}
    prefix: dict[str, Sequence[int]] = {}
    lcp: dict[str, int] = {}
    for i, (r, s) in enumerate(zip(reqs, sim, strict=True)):
        conv = (str(trace[i]["hash_ids"][1]) if trace is not None else r.conversation) or f"#{i}"
        counts[(r.group, conv)] = counts.get((r.group, conv), 0) + 1
        if r.group in prefix:
            lcp[r.group] = min(lcp[r.group], _common_prefix(prefix[r.group], s.prompt_ids))
        else:
            prefix[r.group] = s.prompt_ids
            lcp[r.group] = len(s.prompt_ids)
    convs = [Conversation(g, n, lcp[g]) for (g, _c), n in counts.items()]
    return convs, sum(len(s.prompt_ids) for s in sim)


def _table(cells: Sequence[str], fleets: Sequence[int], seeds: Sequence[int],
           target: float) -> list[dict[str, Any]]:
    rows = []
    for name in cells:
        for n in fleets:
            for seed in seeds:
                convs, tokens = cell_conversations(name, n, seed)
                sizes = [c.requests for c in convs]
                groups: dict[str, int] = {}
                for c in convs:
                    groups[c.group] = groups.get(c.group, 0) + c.requests
                g = copy_greedy(convs, n, target)
                rows.append({"cell": name, "replicas": n, "seed": seed,
                             "requests": sum(sizes), "conversations": len(sizes),
                             "largest": max(sizes), "lower_bound": lower_bound(sizes, n),
                             "lpt": lpt(sizes, n), "no_copy_lpt": lpt(list(groups.values()), n),
                             "greedy": g.max_over_mean, "copies": g.copies,
                             "copy_share": g.copy_tokens / tokens if tokens else 0.0})
    return rows


def _hit_rows(cells: Sequence[str], fleets: Sequence[int], seeds: Sequence[int],
              target: float, sim: bool, kv_seeds: Sequence[int]) -> list[dict[str, Any]]:
    """`cell_bounds` of the `make bench` cells, the 64-replica simulation workloads (seed 0,
    as `make bench` runs them) and the cache-pressure cells of `loadtest.bench_kv`."""
    from loadtest.ceiling import request_prompts
    from loadtest.cells import SIM_WORKLOADS, WORKLOADS, cell_requests

    rows = []
    for name in cells:
        for n in fleets:
            w = next(w for w in WORKLOADS if w.name == name).at(n)
            for seed in seeds:
                with tempfile.TemporaryDirectory(prefix="bound-") as tmp:
                    reqs, _meta = cell_requests(w, seed, Path(tmp))
                ps = list(request_prompts(reqs, w.fleet.block_size, w.fleet.kv_blocks))
                rows.append({"cell": f"{name}, {n}", "seed": seed, "requests": len(reqs),
                             **cell_bounds(ps, n, w.fleet.kv_blocks, w.fleet.block_size,
                                           target, len(reqs))})
    if sim:
        from loadtest.simulate import sim_prompts, workload_requests

        for sw in SIM_WORKLOADS:
            sreqs = workload_requests(sw.name, sw.requests, 0, sw.rate, **sw.spec)
            rows.append({"cell": f"{sw.name}, {sw.replicas}", "seed": 0,
                         "requests": len(sreqs),
                         **cell_bounds(sim_prompts(sreqs, 16, sw.kv_blocks), sw.replicas,
                                       sw.kv_blocks, 16, target, len(sreqs))})
    for seed in kv_seeds:
        rows += _kv_rows(target, seed)
    return rows


def _kv_rows(target: float, seed: int) -> list[dict[str, Any]]:
    """The cache-pressure cells at ``seed`` (`loadtest.bench_kv`'s default: 2026): over HTTP
    (its default 240 requests and the steady 720-request run, 4 replicas) and in the simulator
    (its ``--simulate`` cells)."""
    from dataclasses import replace

    from loadtest.bench_kv import CACHE_PRESSURE, SIM_CELLS, SIM_FLEET, SIM_SPEC
    from loadtest.ceiling import request_prompts
    from loadtest.cells import cell_requests
    from loadtest.simulate import sim_prompts, workload_requests

    rows = []
    for requests in (CACHE_PRESSURE.requests, 3 * CACHE_PRESSURE.requests):
        w = replace(CACHE_PRESSURE, requests=requests)
        with tempfile.TemporaryDirectory(prefix="bound-") as tmp:
            reqs, _meta = cell_requests(w, seed, Path(tmp))
        f = w.fleet
        ps = request_prompts(reqs, f.block_size, f.kv_blocks)
        rows.append({"cell": f"cache-pressure, {f.replicas} (HTTP, {requests} requests)",
                     "seed": seed, "requests": len(reqs),
                     **cell_bounds(ps, f.replicas, f.kv_blocks, f.block_size, target,
                                   len(reqs))})
    shapes: dict[tuple[int, ...], list[float]] = {}  # the rate only spaces the same requests
    for replicas, n, rate, groups, lo, hi in SIM_CELLS:
        shapes.setdefault((replicas, n, groups, lo, hi), []).append(rate)
    for (replicas, n, groups, lo, hi), rates in shapes.items():
        sreqs = workload_requests("cache-pressure", n, seed, rates[0], prompts=groups,
                                  min_prompt_tokens=lo, max_prompt_tokens=hi, **SIM_SPEC)
        kv = SIM_FLEET["kv_blocks"]
        at = " and ".join(f"{r:g}/s" for r in rates)
        rows.append({"cell": f"cache-pressure, {replicas} (simulated, {n} requests, {at})",
                     "seed": seed, "requests": len(sreqs),
                     **cell_bounds(sim_prompts(sreqs, 16, kv), replicas, kv, 16, target,
                                   len(sreqs))})
    return rows


def main(argv: list[str] | None = None) -> int:
    from loadtest.cells import FLEETS, WORKLOADS

    p = argparse.ArgumentParser(prog="python -m loadtest.balance_bound", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, action="append", help="cell seeds (default: 0)")
    p.add_argument("--target", type=float, default=1.3,
                   help="max/mean cap of the copy greedy and of the hit bound")
    p.add_argument("--cell", action="append", help="bench workloads (default: all)")
    p.add_argument("--table", choices=["balance", "hits", "both"], default="both",
                   help="the conversation-balance table, the hit-bound table, or both")
    p.add_argument("--no-bench", action="store_true",
                   help="hit bounds: leave out the `make bench` cells")
    p.add_argument("--no-sim", action="store_true",
                   help="hit bounds: leave out the 64-replica simulation workloads")
    p.add_argument("--kv-seed", type=int, action="append",
                   help="hit bounds: seeds of the cache-pressure cells (loadtest.bench_kv; "
                        "default: its 2026)")
    p.add_argument("--no-kv", action="store_true",
                   help="hit bounds: leave out the cache-pressure cells")
    args = p.parse_args(argv)
    cells = args.cell or [w.name for w in WORKLOADS]
    seeds = args.seed or [0]
    if args.table in ("balance", "both"):
        print("| cell | seed | requests / conversations | largest | lower bound | LPT | "
              "LPT, one replica per group | greedy at the cap | prefix copies "
              "(% of prompt tokens) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in _table(cells, FLEETS, seeds, args.target):
            print(f"| {r['cell']}, {r['replicas']} | {r['seed']} | {r['requests']} / "
                  f"{r['conversations']} | {r['largest']} | {r['lower_bound']:.2f} | "
                  f"{r['lpt']:.2f} | {r['no_copy_lpt']:.2f} | {r['greedy']:.2f} | "
                  f"{r['copies']} ({100 * r['copy_share']:.1f} %) |", flush=True)
        print()
    if args.table in ("hits", "both"):
        t = f"{args.target:g}"
        print(f"| cell | seed | requests | one-cache LRU ceiling | bound, no cap | bound at "
              f"max/mean <= {t} | OPT bound (Belady) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        kv_seeds = [] if args.no_kv else (args.kv_seed or [2026])
        for r in _hit_rows([] if args.no_bench else cells, FLEETS, seeds, args.target,
                           not args.no_sim, kv_seeds):
            print(f"| {r['cell']} | {r['seed']} | {r['requests']} | "
                  f"{100 * r['ceiling']['hit_rate']:.2f} % | "
                  f"{100 * r['infinite']['hit_rate']:.2f} % | "
                  f"{100 * r['at_target']['hit_rate']:.2f} % | "
                  f"{100 * r['opt']['hit_rate']:.2f} % |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
