"""Several models on real vLLM: one CPU vLLM replica serving the tiny Llama plus a LoRA adapter
(``--enable-lora --max-loras 1 --lora-modules sql=...``, the adapter written by
``scripts/make_tiny_lora.py``) and one simulated replica serving another model, behind one
router, through the official `openai` client.

What only the real thing can show: vLLM lists the adapter in /v1/models with ``parent``, its
``vllm:lora_requests_info`` is what the router parses, and vLLM itself never shares KV blocks
between the adapter and its base model (measured with its own prefix-cache counters) - the
reason the router's keys are per model."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from loadtest.replica import Replica, ReplicaConfig
from loadtest.vllm_fleet import VllmEnv, VllmFleet, make_lora_adapter, parse_metrics
from tests.conftest import ThreadedServer

from ._prompts import prose

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"


@pytest.fixture(scope="module")
def lora_fleet(vllm_env: VllmEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmFleet]:
    adapter = make_lora_adapter(vllm_env, tmp_path_factory.mktemp("lora") / "sql")
    fleet = VllmFleet(n=1, model_dir=vllm_env.model_dir, venv=vllm_env.venv, block_size=32,
                      served_model_name="tiny-llama", log_dir=tmp_path_factory.mktemp("lora-logs"),
                      extra_args=["--enable-lora", "--max-loras", "1", "--max-lora-rank", "8",
                                  "--lora-modules", f"sql={adapter}"])
    with fleet:
        yield fleet


@pytest.fixture(scope="module")
def routed(lora_fleet: VllmFleet) -> Iterator[tuple[str, Any]]:
    from router.app import create_app
    from router.settings import Settings

    with ThreadedServer(Replica(ReplicaConfig(name="sim-qwen", model="qwen", instant=True))) as sim:
        settings = Settings.from_dict({
            "replicas": [{"name": "vllm0", "url": lora_fleet.urls[0]},
                         {"name": "sim-qwen", "url": sim.url}],
            "health": {"interval": 0.5, "timeout": 10.0},
            "scrape": {"interval": 0.2},
            "proxy": {"first_byte_timeout": 120.0},
            "logging": {"access_log": False}})
        app = create_app(settings)
        with ThreadedServer(app) as server:
            deadline = time.monotonic() + 30
            while any(s.models is None for s in app.replicas.states()):
                assert time.monotonic() < deadline, "model lists never learned"
                time.sleep(0.1)
            yield server.url, app


def client(url: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_the_router_learns_vllms_adapter_and_routes_each_model_to_its_replica(
        routed: tuple[str, Any]) -> None:
    url, app = routed
    vllm0 = app.replicas.get("vllm0")
    fresh = httpx.get(vllm0.url + "/metrics", timeout=30).text
    assert "# TYPE vllm:lora_requests_info gauge" in fresh  # the family, no sample before a step
    assert "vllm:lora_requests_info{" not in fresh and vllm0.max_lora == 0
    assert vllm0.models == {"tiny-llama", "sql"} and dict(vllm0.parents) == {"sql": "tiny-llama"}
    listed = {m.id: m.model_extra.get("parent") for m in client(url).models.list().data}
    assert listed == {"tiny-llama": None, "sql": "tiny-llama", "qwen": None}
    c = client(url)
    for model, replica in (("sql", "vllm0"), ("tiny-llama", "vllm0"), ("qwen", "sim-qwen")):
        raw = c.completions.with_raw_response.create(model=model, prompt="Say hi.", max_tokens=2)
        assert raw.headers["x-prefix-router-replica"] == replica
        assert raw.parse().model == model
    with pytest.raises(openai.NotFoundError) as err:
        c.completions.create(model="nope", prompt="hi", max_tokens=1)
    assert err.value.body["code"] == "model_not_found"  # the router's, vLLM never saw it
    # vLLM's gauge is parsed: one LoRA slot. vLLM sets it at engine steps only (a fresh replica
    # exports the family without a sample), so it is known from the router's first scrape after
    # the requests above: wait for that scrape, not for a fixed time
    deadline = time.monotonic() + 30
    while vllm0.max_lora == 0:
        assert time.monotonic() < deadline, f"lora_requests_info never learned: {vllm0}"
        time.sleep(0.05)
    assert vllm0.max_lora == 1


def test_vllm_never_shares_blocks_between_an_adapter_and_its_base(
        lora_fleet: VllmFleet, routed: tuple[str, Any], unique: str) -> None:
    url, _ = routed
    c = client(url)
    prompt = unique + " " + prose(unique, 600)

    def counters() -> tuple[float, float]:
        m = parse_metrics(httpx.get(lora_fleet.urls[0] + "/metrics", timeout=30).text)
        return m.get(QUERIES, 0.0), m.get(HITS, 0.0)

    def delta(model: str) -> float:
        queries, hits = counters()
        c.completions.create(model=model, prompt=prompt, max_tokens=1)
        # the stat logger can trail the response: wait until it counted this request's lookup
        # (queries and hits are set by the same step's stats)
        deadline = time.monotonic() + 30
        while (now := counters())[0] == queries:
            assert time.monotonic() < deadline, "vLLM never counted the prefix-cache lookup"
            time.sleep(0.05)
        return now[1] - hits

    assert delta("tiny-llama") == 0  # cold
    assert delta("sql") == 0  # the same prompt, the adapter: vLLM recomputes every block
    assert delta("sql") > 0  # the adapter's own blocks are reused
    assert delta("tiny-llama") > 0  # and the base model's are still there
