"""`loadtest.bench_disagg`'s pure parts and the `+pd` setups it runs."""

from __future__ import annotations

import math

import pytest

from loadtest.bench_disagg import BLOCK, prefill_hit_rate, render
from loadtest.doc_blocks import blocks
from loadtest.setups import Setup, _router_settings, parse_setup, pd_halves

REPLICAS = [("sim-0", "http://h:1"), ("sim-1", "http://h:2"), ("sim-2", "http://h:3"),
            ("sim-3", "http://h:4")]


@pytest.mark.parametrize(("text", "setup"), [
    ("router-cache_aware+pd", Setup("router", "cache_aware", pd=True)),
    ("vllm-cache_aware+pd", Setup("vllm", "cache_aware", pd=True)),
])
def test_pd_setups_parse_and_keep_their_name(text: str, setup: Setup) -> None:
    assert parse_setup(text) == setup and setup.name == text and setup.single == setup


@pytest.mark.parametrize("text", ["nginx+pd", "sglang-cache_aware+pd", "router-prefix-x2+pd"])
def test_pd_is_refused_where_it_does_not_apply(text: str) -> None:
    with pytest.raises(ValueError):
        parse_setup(text)


def test_pd_halves_and_router_roles() -> None:
    prefill, decode = pd_halves(REPLICAS)
    assert [r[0] for r in prefill] == ["sim-0", "sim-1"]
    assert [r[0] for r in decode] == ["sim-2", "sim-3"]
    entries = _router_settings(REPLICAS, "cache_aware", "xxhash", 1, pd=True)["replicas"]
    assert [e["role"] for e in entries] == ["prefill", "prefill", "decode", "decode"]  # type: ignore[attr-defined,index]
    assert "role" not in _router_settings(REPLICAS, "cache_aware", "xxhash", 1)["replicas"][0]  # type: ignore[index]


def test_prefill_hit_rate_counts_only_the_instances_that_prefilled() -> None:
    per = {"sim-0": {"hit_tokens": 90.0, "query_tokens": 100.0},
           "sim-1": {"hit_tokens": 10.0, "query_tokens": 100.0},
           "sim-2": {"hit_tokens": 0.0, "query_tokens": 500.0}}  # a decode instance
    assert prefill_hit_rate(per, ["sim-0", "sim-1"]) == 0.5
    assert math.isnan(prefill_hit_rate(per, ["sim-9"]))


def test_render_is_one_block_with_a_row_per_setup() -> None:
    row = {"prefill_hit_rate": 0.8, "ttft": {"p50": 0.02, "p99": 0.5},
           "itl": {"p50": 0.01, "p99": 0.03}, "ok": 10, "sent": 10,
           "router_cpu_ms_per_request": 1.5, "preemptions": {"sim-2": 2.0, "sim-3": 1.0}}
    data = {"workload": {"name": "shared-prefix", "requests": 10, "rate": 2.0, "prompts": 4,
                         "min_prompt_tokens": 100, "max_prompt_tokens": 200, "max_tokens": 8,
                         "seed": 0},
            "fleet": {"speed": 1.0, "kv_blocks": 64, "kv_transfer_config": "{}"},
            "rounds": 2, "date": "2026-12-06",
            "runs": {"router-cache_aware+pd": [row, {**row, "prefill_hit_rate": 0.6}]},
            "skipped": {"vllm-cache_aware+pd": "vllm-router is not installed"}}
    text = render(data)
    assert list(blocks(text)) == [BLOCK]
    assert ("| `router-cache_aware+pd` | 0.700 | 20 ms | 500 ms | 10 ms | 30 ms | 3 | 1.50 ms "
            "| 20 / 20 |") in text
    assert "| `vllm-cache_aware+pd` | not run: vllm-router is not installed |" in text
    assert "Targets" not in text  # nothing to compare with


def test_targets_compare_with_vllm_router_round_by_round() -> None:
    def row(hit: float, ttft: float, itl: float) -> dict:
        return {"prefill_hit_rate": hit, "ttft": {"p50": 0.0, "p99": ttft},
                "itl": {"p50": 0.0, "p99": itl}, "ok": 1, "sent": 1,
                "router_cpu_ms_per_request": 1.0, "preemptions": {}}

    data = {"workload": {"name": "shared-prefix", "requests": 1, "rate": 1.0, "prompts": 1,
                         "min_prompt_tokens": 1, "max_prompt_tokens": 2, "max_tokens": 1,
                         "seed": 0},
            "fleet": {"speed": 1.0, "kv_blocks": 64, "kv_transfer_config": "{}"},
            "rounds": 2, "date": "2026-12-06", "skipped": {},
            "runs": {"router-cache_aware+pd": [row(0.9, 0.4, 0.020), row(0.9, 0.5, 0.024)],
                     "vllm-cache_aware+pd": [row(0.8, 0.6, 0.021), row(0.8, 0.6, 0.021)]}}
    text = render(data)
    assert "| prefill-pool hit rate >= | 0.900 (0.900 / 0.900) | 0.800 (0.800 / 0.800) | yes |" in text
    assert "| TTFT p99 <= | 450.0 ms (400.0 ms / 500.0 ms) | 600.0 ms (600.0 ms / 600.0 ms) | yes |" in text
    assert "| inter-token latency p99 <= | 22.0 ms (20.0 ms / 24.0 ms) | 21.0 ms (21.0 ms / 21.0 ms) | no |" in text

