"""`prefix-router serve --backend ... --workers 2` as a process, in front of the real replicas.

The deployment shape rather than the in-process app: two uvicorn workers each route on their
own, and prefix affinity must still hold because the routing decision is a pure function of the
key and the membership — measured by vLLM: every request after the first hits the cache.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadtest._net import quiet_port
from loadtest.vllm_fleet import VllmFleet

from ._process import serving
from ._prompts import chat

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture
def router_process(fleet: VllmFleet, tmp_path: Path) -> Iterator[str]:
    port = quiet_port()
    backends = [arg for url in fleet.urls for arg in ("--backend", url)]
    argv = [sys.executable, "-m", "router", "serve", *backends, "--port", str(port),
            "--workers", "2"]
    with serving(argv, port, tmp_path / "router.log", stop_timeout=30) as url:
        yield url


def test_cli_router_with_two_workers_keeps_prefix_affinity(fleet: VllmFleet, router_process: str,
                                                           unique: str) -> None:
    before = [fleet.prefix_cache(i) for i in range(fleet.n)]
    answers = []
    # a new connection per request, so the kernel spreads them over both workers
    for k in range(6):
        body = {"model": "tiny-llama", "messages": chat(unique, f"question {'x' * k}"),
                "max_tokens": 2, "stream": k % 2 == 1}
        resp = httpx.post(router_process + "/v1/chat/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        answers.append(resp.headers["x-prefix-router-replica"])
    after = [fleet.prefix_cache(i) for i in range(fleet.n)]
    assert len(set(answers)) == 1, answers
    home = int(answers[0].removeprefix("r"))  # --backend order names them r0, r1
    other = 1 - home
    queries = after[home][0] - before[home][0]
    hits = after[home][1] - before[home][1]
    print(f"\nCLI router, 2 workers: all 6 on r{home}; queries +{queries:.0f}, hits +{hits:.0f}")
    assert after[other] == before[other]
    assert hits >= 5 * 10 * 32  # five repeats of a system prompt of more than ten blocks
