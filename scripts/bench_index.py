"""Memory and time of the cache_aware prefix index over a million requests (docs/router.md).

Feeds N synthetic chat requests - 64 system prompts of 1-4k tokens with Zipf popularity,
conversations of 1-8 turns, each turn resending its history - through `router.chunks` and
`router.prefix_index.ApproxIndex` (match, then record on the replica that "served" it, as the
proxy's outcome does) for a fleet of R replicas, each bounded by its KV capacity. Reports the
index's entries and its memory (tracemalloc, the index alone) after N requests, and the time per
request of chunking, matching and recording.

    .venv/bin/python scripts/bench_index.py [--requests 1000000] [--replicas 8]
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from router.chunks import request_chunks
from router.prefix_index import ApproxIndex
from router.settings import RoutingSettings

WORDS = "the of and to in is you that it for are as with be on not this but by from".split()


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--capacity", type=int, default=RoutingSettings.kv_capacity_tokens,
                   help="KV tokens per replica (default: routing.kv_capacity_tokens)")
    args = p.parse_args()
    rng = random.Random(18)
    systems = [text(rng, rng.randint(700, 2800)) for _ in range(64)]
    weights = [1 / (k + 1) ** 1.1 for k in range(64)]
    s = RoutingSettings()
    tracemalloc.start()
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    index = ApproxIndex(args.capacity, s.index_max_entries)
    after_empty = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()  # tracing every allocation would dominate the timing below
    names = [f"r{i}" for i in range(args.replicas)]
    live: list[tuple[list[dict[str, str]], int]] = []
    t_chunks = t_index = 0.0
    for n in range(args.requests):
        if live and rng.random() < 0.6:
            i = rng.randrange(len(live))
            msgs, turns = live[i]
            msgs.append({"role": "assistant", "content": text(rng, 40)})
            if turns <= 1:
                live[i] = live[-1]
                live.pop()
            else:
                live[i] = (msgs, turns - 1)
        else:
            msgs = [{"role": "system", "content": rng.choices(systems, weights)[0]}]
            if len(live) < 2000:
                live.append((msgs, rng.randint(1, 8)))
        msgs.append({"role": "user", "content": f"{n} " + text(rng, 20)})
        body = {"model": "m", "messages": msgs}
        t0 = time.perf_counter()
        chunks = request_chunks("/v1/chat/completions", body, s.chunk_chars, s.chars_per_token)
        t1 = time.perf_counter()
        held = index.match(chunks)
        target = max(held, key=lambda r: held[r]) if held else names[n % len(names)]
        index.record(target, chunks)
        t_index += time.perf_counter() - t1
        t_chunks += t1 - t0
    tracemalloc.start()
    gc.collect()
    base = tracemalloc.get_traced_memory()[0]
    # measure the index by rebuilding a copy of its contents under tracing
    copy = ApproxIndex(args.capacity, s.index_max_entries)
    for name, r in index._replicas.items():
        for h, w in r.entries.items():
            copy._get(name).entries[h] = w
            copy._holders.setdefault(h, set()).add(name)
    size = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    entries = sum(index.stats().values())
    print(f"requests {args.requests:,}  replicas {args.replicas}  capacity {args.capacity:,} "
          f"tokens each")
    print(f"index entries {entries:,} ({len(index._holders):,} distinct hashes), memory "
          f"{size / 2**20:.1f} MiB ({size / max(1, entries):.0f} B per entry; empty index "
          f"{after_empty - before} B)")
    print(f"per request: chunks {t_chunks / args.requests * 1e6:.1f} us, match + record "
          f"{t_index / args.requests * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
