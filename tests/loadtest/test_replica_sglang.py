"""sglang-router (sgl-model-gateway) accepts the simulated replica as a worker.

The gateway probes the worker, reads ``model_path`` from ``/server_info`` / ``/model_info`` and
loads a tokenizer from that local directory; then it proxies OpenAI requests to it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtest._net import quiet_port
from loadtest.replica import Replica, ReplicaConfig

pytestmark = pytest.mark.slow


def make_tokenizer_dir(root: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["hello world route the request to a warm cache"],
                            trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    root.mkdir()
    tok.save(str(root / "tokenizer.json"))
    return root


def test_sglang_router_registers_and_proxies_to_the_replica(
        threaded_server: Callable[..., Any], tmp_path: Path) -> None:
    pytest.importorskip("sglang_router")
    model_dir = make_tokenizer_dir(tmp_path / "model")
    replica = threaded_server(Replica(ReplicaConfig(name="sim-sg", model_path=str(model_dir),
                                                    speed=50.0)))
    port = quiet_port()
    log = tmp_path / "sglang.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", replica.url,
             "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        answer = None
        for _ in range(300):   # bounded: ~30 s for the gateway to come up and register
            if proc.poll() is not None:
                break
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=5, json={
                    "model": "sim-model", "max_tokens": 3,
                    "messages": [{"role": "user", "content": "hello world"}]})
                if r.status_code == 200:
                    answer = r.json()
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
        assert answer is not None, text[-3000:]
        assert answer["system_fingerprint"] == "sim-sg"
        assert f"from source: {model_dir}" in text      # tokenizer loaded from our model_path
        assert "Successfully registered tokenizer" in text
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("name", ["rag", "agent"])
def test_sglang_router_routes_the_rag_and_agent_workloads_unchanged(
        name: str, threaded_server: Callable[..., Any], tmp_path: Path) -> None:
    """Documents in user turns, tools, tool calls with null content and tool results pass
    sglang-router's request parsing, and reach a replica as the same prompt as sent directly."""
    pytest.importorskip("sglang_router")
    from loadtest.setups import Setup, launch, tiny_tokenizer_dir
    from loadtest.workloads import WorkloadSpec, generate

    model_dir = tiny_tokenizer_dir(tmp_path / "model")
    replicas = [threaded_server(Replica(ReplicaConfig(name=f"sim-{i}", model_path=str(model_dir),
                                                      instant=True))) for i in range(2)]
    reqs = generate(WorkloadSpec(name, requests=12, seed=1, prompts=2, min_prompt_tokens=100,
                                 max_prompt_tokens=200, min_history_tokens=1500,
                                 max_history_tokens=2500, stream=False))
    with launch(Setup("sglang", "cache_aware"),
                [(f"sim-{i}", r.url) for i, r in enumerate(replicas)], tmp_path) as router:
        for r in reqs:
            via = httpx.post(router.url + r.path, content=r.json_bytes(), timeout=30,
                             headers={"content-type": "application/json"})
            assert via.status_code == 200, via.text[:500]
            direct = httpx.post(replicas[0].url + r.path, content=r.json_bytes(), timeout=30,
                                headers={"content-type": "application/json"})
            assert via.json()["usage"]["prompt_tokens"] == direct.json()["usage"]["prompt_tokens"]
