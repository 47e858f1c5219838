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

Pure; cost O(k log k + k n) for k conversations on n replicas. ``python -m
loadtest.balance_bound`` prints the table for the `make bench` cells.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Conversation", "Placement", "cell_conversations", "copy_greedy", "lower_bound",
           "lpt"]


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


def lower_bound(sizes: Sequence[int], replicas: int) -> float:
    """max(largest conversation, total / n) over the mean: no placement of whole
    conversations does better."""
    total = sum(sizes)
    if not total or replicas < 1:
        return 1.0
    mean = total / replicas
    return max(max(sizes), mean) / mean


def lpt(sizes: Sequence[int], replicas: int) -> float:
    """max/mean of the longest-processing-time-first placement (within 4/3 of the optimum)."""
    total = sum(sizes)
    if not total or replicas < 1:
        return 1.0
    loads = [0] * replicas
    for s in sorted(sizes, reverse=True):
        i = loads.index(min(loads))
        loads[i] += s
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


def main(argv: list[str] | None = None) -> int:
    from loadtest.cells import FLEETS, WORKLOADS

    p = argparse.ArgumentParser(prog="python -m loadtest.balance_bound", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, action="append", help="cell seeds (default: 0)")
    p.add_argument("--target", type=float, default=1.3, help="max/mean cap of the copy greedy")
    p.add_argument("--cell", action="append", help="bench workloads (default: all)")
    args = p.parse_args(argv)
    cells = args.cell or [w.name for w in WORKLOADS]
    print("| cell | seed | requests / conversations | largest | lower bound | LPT | "
          "LPT, one replica per group | greedy at the cap | prefix copies (% of prompt tokens) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in _table(cells, FLEETS, args.seed or [0], args.target):
        print(f"| {r['cell']}, {r['replicas']} | {r['seed']} | {r['requests']} / "
              f"{r['conversations']} | {r['largest']} | {r['lower_bound']:.2f} | {r['lpt']:.2f} | "
              f"{r['no_copy_lpt']:.2f} | {r['greedy']:.2f} | {r['copies']} "
              f"({100 * r['copy_share']:.1f} %) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
