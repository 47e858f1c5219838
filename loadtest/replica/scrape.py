"""Read a replica's (or real vLLM's) /metrics into {sample name: value summed over label sets}.

Used by tests and load-test reports to read counters such as
``vllm:prefix_cache_hits_total`` without caring about label order. O(size of the text).
"""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def parse(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def scrape(base_url: str, timeout: float = 5.0) -> dict[str, float]:
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout) as resp:
        return parse(resp.read().decode())
