"""One real vLLM replica, no router: the env serves, and its prefix cache behaves as we model it.

Proves the facts the router and the simulator rely on: vLLM counts prefix-cache queries and hits
in prompt tokens; a repeated prompt hits every full block except the one holding the last token
(vLLM always recomputes at least one token), i.e. ``(n - 1) // block_size * block_size``; the
metric delta equals the per-request ``cached_tokens`` reported by --enable-prompt-tokens-details.
"""

from __future__ import annotations

import time
import urllib.request

import pytest

from loadtest.vllm_fleet import VllmFleet

from ._prompts import chat

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def test_cache_config_reports_block_size(fleet: VllmFleet) -> None:
    with urllib.request.urlopen(fleet.urls[0] + "/metrics") as resp:
        text = resp.read().decode()
    info = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
    assert info and 'block_size="32"' in info[0] and 'enable_prefix_caching="True"' in info[0]
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total"):
        assert name in fleet.metrics(0), name


def test_chat_completion_and_repeat_hits_full_blocks(fleet: VllmFleet, openai_client, unique) -> None:
    client = openai_client(fleet.urls[0])
    messages = chat(unique, "summarise the text above")
    timings = []
    results = []
    for _ in range(2):
        q0, h0 = fleet.prefix_cache(0)
        t0 = time.perf_counter()
        stream = client.chat.completions.create(
            model="tiny-llama", messages=messages, max_tokens=4, stream=True,
            stream_options={"include_usage": True})
        ttft = None
        usage = None
        text = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft or time.perf_counter() - t0
                text.append(chunk.choices[0].delta.content)
            if chunk.usage:
                usage = chunk.usage
        q1, h1 = fleet.prefix_cache(0)
        assert usage is not None and usage.completion_tokens == 4 and text
        timings.append(ttft)
        results.append((usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens,
                        q1 - q0, h1 - h0))
    (n, cached_cold, queries_cold, hits_cold), (n2, cached_warm, queries_warm, hits_warm) = results
    print(f"\nprompt {n} tokens: TTFT cold {timings[0] * 1000:.0f} ms, warm {timings[1] * 1000:.0f} ms;"
          f" hits cold {hits_cold:.0f}, warm {hits_warm:.0f}")
    assert n == n2 > 32 * 10
    assert queries_cold == queries_warm == n
    assert cached_cold == hits_cold == 0
    assert cached_warm == hits_warm == (n - 1) // 32 * 32


def test_completions_endpoint_counts_prompt_tokens(fleet: VllmFleet, openai_client, unique) -> None:
    client = openai_client(fleet.urls[1])
    prompt = f"{unique} " + chat(unique, "")[0]["content"]
    q0, _ = fleet.prefix_cache(1)
    resp = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=3,
                                     extra_body={"ignore_eos": True})
    q1, _ = fleet.prefix_cache(1)
    assert resp.usage.completion_tokens == 3
    assert q1 - q0 == resp.usage.prompt_tokens
