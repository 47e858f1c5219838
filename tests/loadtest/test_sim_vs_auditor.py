"""The simulator's cache hits equal the auditor's projection for the same trace (one code path).

A trace of chat requests (shared system prompts, one with a per-request timestamp, varied user
turns) is sent in order, non-streamed, to one simulated replica over HTTP; the same trace is
audited with `prefix-audit --format json`. Both tokenise with the default tokenizer, render with
the default ChatML template and count hits with `templates_audit.blocks.PrefixCache`, so the
replica's `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` must equal the
auditor's `observed_hit_rate` exactly, and its `cached_tokens` per request must add up to the
same hit tokens.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx

from loadtest.replica import Replica, ReplicaConfig
from loadtest.replica.scrape import parse
from loadtest.workloads import synthetic_text


def _trace(n: int) -> list[dict[str, Any]]:
    rng = random.Random(5)
    prompts = [f"You are agent {i}.\n" + synthetic_text(rng, 150 + 60 * i) for i in range(3)]
    out = []
    for i in range(n):
        p = rng.randrange(3)
        system = prompts[p]
        if p == 2:  # a template that injects a per-request timestamp on line 2
            head, _, rest = system.partition("\n")
            system = f"{head}\nCurrent time: 2026-03-0{1 + i % 9}T10:{i % 60:02d}:00Z\n{rest}"
        out.append({
            "model": "sim-model",
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": f"question {i}: " + synthetic_text(rng, 12)}],
            "max_tokens": 1,
        })
    return out


def test_simulator_hits_equal_auditor_projection(threaded_server: Callable[..., Any], tmp_path: object) -> None:
    trace = _trace(60)
    path = f"{tmp_path}/trace.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in trace)

    srv = threaded_server(Replica(ReplicaConfig(instant=True, kv_blocks=1 << 16)))
    cached = prompt = 0
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        for body in trace:
            r = client.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            usage = r.json()["usage"]
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            prompt += usage["prompt_tokens"]
        metrics = parse(client.get("/metrics").text)
    hits = metrics["vllm:prefix_cache_hits_total"]
    queries = metrics["vllm:prefix_cache_queries_total"]
    assert (hits, queries) == (cached, prompt)
    assert 0 < hits < queries

    out = subprocess.run([sys.executable, "-m", "templates_audit", path, "--format", "json"],
                         capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout)
    assert report["summary"]["requests"] == 60
    summary = report["summary"]
    assert summary["prompt_tokens"] == queries
    # the report rounds rates to 6 decimals; with < 500k prompt tokens that still pins the
    # hit count to one integer, which must be the replica's
    assert round(summary["observed_hit_rate"] * summary["prompt_tokens"]) == hits
    assert summary["observed_hit_rate"] == round(hits / queries, 6)
    # the timestamp on line 2 of one template is what the auditor blames
    assert any(f["kind"] == "timestamp" and f["role"] == "system" for f in report["findings"])
