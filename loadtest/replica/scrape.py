"""Read a replica's (or real vLLM's) /metrics into {sample name: value summed over label sets}.

Used by tests and load-test reports to read counters such as
``vllm:prefix_cache_hits_total`` without caring about label order. The parsing is
`loadtest.stats.parse_prometheus`; this module only drops ``*_created`` samples (creation
timestamps, not values). O(size of the text).
"""

from __future__ import annotations

import urllib.request

from ..stats import parse_prometheus


def parse(text: str) -> dict[str, float]:
    return {name: value for name, value in parse_prometheus(text).items()
            if not name.endswith("_created")}


def scrape(base_url: str, timeout: float = 5.0) -> dict[str, float]:
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout) as resp:
        return parse(resp.read().decode())
