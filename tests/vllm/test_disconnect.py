"""A client that leaves mid-stream makes the router abort the generation on the real replica.

Evidence comes from vLLM, not from the router: the replica's `vllm:num_requests_running` drops
back to 0 and `vllm:generation_tokens_total` grew by far less than the `max_tokens` the request
asked for with `ignore_eos` (which, had it run on, it would have produced exactly).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from loadtest.vllm_fleet import VllmFleet

from ._prompts import chat

if TYPE_CHECKING:
    from .conftest import RouterUnderTest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

MAX_TOKENS = 3000


def _wait_idle(fleet: VllmFleet, i: int, polls: int = 300) -> dict[str, float]:
    m = fleet.metrics(i)
    for _ in range(polls):
        if (
            m.get("vllm:num_requests_running", 0) == 0
            and m.get("vllm:num_requests_waiting", 0) == 0
        ):
            return m
        time.sleep(0.1)
        m = fleet.metrics(i)
    return m


def _running(fleet: VllmFleet, i: int, polls: int = 50) -> float:
    """``vllm:num_requests_running`` of replica ``i`` once it is >= 1, or its last value after
    ``polls`` reads 0.1 s apart (the gauge is written once per engine step)."""
    running = fleet.metrics(i).get("vllm:num_requests_running", 0)
    for _ in range(polls):
        if running >= 1:
            break
        time.sleep(0.1)
        running = fleet.metrics(i).get("vllm:num_requests_running", 0)
    return running


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_client_disconnect_aborts_generation(
    fleet: VllmFleet, router: RouterUnderTest, unique: str, path: str
) -> None:
    if path == "/v1/chat/completions":
        body: dict[str, Any] = {"messages": chat(unique, "keep going")}
    else:
        body = {"prompt": chat(unique, "")[0]["content"]}
    body.update(model="tiny-llama", max_tokens=MAX_TOKENS, stream=True, ignore_eos=True)
    before = {i: _wait_idle(fleet, i) for i in range(fleet.n)}
    with (
        httpx.Client(base_url=router.url, timeout=120) as http,
        http.stream("POST", path, json=body) as resp,
    ):
        assert resp.status_code == 200
        i = fleet.names.index(resp.headers["x-prefix-router-replica"])
        received = 0  # chunks carrying generated text: each is at least one token
        # Held in a name: a `break` out of a bare `resp.iter_lines()` finalises the generator
        # chain, and httpcore closes the connection on that — the client would have left before
        # the running check below (seen in CI: running 0 after 20 tokens, abort already done).
        lines = resp.iter_lines()
        for line in lines:
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                choice = json.loads(line[5:])["choices"][0]
                received += bool(choice.get("text") or (choice.get("delta") or {}).get("content"))
            if received == 20:
                break
        assert received == 20  # the generation is well under way
        assert _running(fleet, i) >= 1  # vLLM itself says the request is generating
    # leaving the `with` closed the connection mid-stream
    after = _wait_idle(fleet, i)
    assert after["vllm:num_requests_running"] == 0, "vLLM kept generating after the client left"
    generated = after["vllm:generation_tokens_total"] - before[i]["vllm:generation_tokens_total"]
    print(f"\n{fleet.names[i]} generated {generated:.0f} of {MAX_TOKENS} tokens before the abort")
    assert received <= generated < MAX_TOKENS
