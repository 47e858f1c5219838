"""Several models on the simulated replica: served names, vLLM's 404, LoRA adapters (their
block hashes, slots, load time) and ``vllm:lora_requests_info``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from loadtest.fleet import mixed_members, parse_loras, parse_models
from loadtest.replica import Replica, ReplicaConfig
from loadtest.replica.config import add_arguments, from_namespace, to_argv
from loadtest.replica.engine import Engine, EngineLimits, EngineRequest
from loadtest.replica.timing import TimingModel

Start = Callable[..., Any]
HTTP = httpx.Client(timeout=30)
SYSTEM = "You are the SQL assistant of the billing team. " * 12


@pytest.fixture
def replica(threaded_server: Start) -> Callable[..., str]:
    def start(**options: Any) -> str:
        options.setdefault("speed", 50.0)
        return str(threaded_server(Replica(ReplicaConfig(name="sim-a", **options))).url)

    return start


def client(url: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)


def ask(c: Any, model: str, user: str = "List the tables.") -> Any:
    return c.chat.completions.create(model=model, max_tokens=3, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])


def test_models_lists_adapters_with_their_parent_as_vllm(replica: Callable[..., str]) -> None:
    url = replica(model="llama", lora=("sql", "support"))
    data = HTTP.get(url + "/v1/models").json()["data"]
    assert [(m["id"], m["parent"]) for m in data] == [
        ("llama", None), ("sql", "llama"), ("support", "llama")]
    assert data[0]["max_model_len"] == 32768 and data[1]["max_model_len"] is None


def test_unknown_model_is_vllms_404(replica: Callable[..., str]) -> None:
    url = replica(model="llama", lora=("sql",))
    with pytest.raises(openai.NotFoundError) as err:
        ask(client(url), "qwen")
    # vLLM 0.32's shape, checked against a real vllm serve with --lora-modules
    assert err.value.body == {"message": "The model `qwen` does not exist. Valid aliases: llama.",
                              "type": "NotFoundError", "param": "model", "code": 404}
    raw = HTTP.post(url + "/v1/completions", json={"model": "nope", "prompt": "hi"})
    assert raw.status_code == 404 and raw.json()["error"]["param"] == "model"
    # a body without a model is the base model's, as in vLLM
    ok = HTTP.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert ok.status_code == 200 and ok.json()["model"] == "llama"


def test_adapters_never_share_cached_blocks(replica: Callable[..., str]) -> None:
    c = client(replica(model="llama", lora=("sql", "support")))
    cold = [ask(c, m).usage.prompt_tokens_details.cached_tokens for m in ("sql", "support", "llama")]
    warm = ask(c, "sql", "Another question.")
    assert cold == [0, 0, 0]  # one prompt, three block-hash chains
    assert warm.usage.prompt_tokens_details.cached_tokens > 100  # the adapter's own prefix hits
    assert warm.model == "sql"


def test_lora_requests_info_is_exported_as_vllm_does(replica: Callable[..., str]) -> None:
    url = replica(model="llama", lora=("sql",), max_lora=2)
    fresh = HTTP.get(url + "/metrics").text  # vLLM 0.32 too: the family, no sample, until a step
    assert "# TYPE vllm:lora_requests_info gauge" in fresh
    assert "vllm:lora_requests_info{" not in fresh
    ask(client(url), "sql")
    samples = [line for line in HTTP.get(url + "/metrics").text.splitlines()
               if line.startswith("vllm:lora_requests_info{")]
    assert samples
    assert all('max_lora="2"' in k and "running_lora_adapters=" in k
               and "waiting_lora_adapters=" in k for k in samples)
    # the value is the time the label set was seen (vLLM's set_to_current_time)
    assert all(float(k.rsplit(" ", 1)[1]) > 1.7e9 for k in samples)
    plain = replica(model="llama")
    assert "vllm:lora_requests_info" not in HTTP.get(plain + "/metrics").text


def test_max_lora_holds_back_a_second_adapter_and_a_load_costs_time() -> None:
    async def main() -> tuple[list[str], list[str], int, list[int]]:
        engine = Engine(EngineLimits(max_loras=1), TimingModel(speed=1000.0))
        a = EngineRequest("a", list(range(40)), 4, lora="sql")
        b = EngineRequest("b", list(range(40)), 4, lora="support")
        base = EngineRequest("c", list(range(50, 90)), 4)
        for r in (a, b, base):
            engine.submit(r)
        plan = engine.schedule()
        admitted = [s.req.request_id for s, _ in plan.chunks]
        running, waiting = engine.lora_adapters()
        loads = [plan.lora_loads]
        engine.apply(plan, 0.0)
        return admitted, [*running, "|", *waiting], engine.lora_loads, loads

    admitted, adapters, loads, step_loads = asyncio.run(main())
    assert admitted == ["a", "c"]  # b's adapter does not fit: skipped, c goes on
    assert adapters == ["sql", "|", "support"]
    assert loads == 1 and step_loads == [1]
    t = TimingModel(lora_load_ms=50.0)
    assert t.step_seconds(0, 1, lora_loads=1) - t.step_seconds(0, 1) == pytest.approx(0.05)


def test_resident_adapter_is_not_loaded_again_and_lru_is_evicted() -> None:
    engine = Engine(EngineLimits(max_loras=1), TimingModel())
    assert engine._load_lora("sql", set()) == 1
    assert engine._load_lora("sql", set()) == 0
    assert engine._load_lora("support", set()) == 1 and list(engine.resident) == ["support"]


def test_lora_flag_repeats_and_round_trips() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = from_namespace(parser.parse_args(["--model", "llama", "--lora", "sql", "--lora", "x",
                                            "--max-lora", "2"]))
    assert cfg.lora == ("sql", "x") and cfg.max_lora == 2
    assert to_argv({"lora": ("sql", "x")}) == ["--lora", "sql", "--lora", "x"]
    assert from_namespace(parser.parse_args([])).lora == ()
    with pytest.raises(ValueError, match="lora"):
        ReplicaConfig(model="llama", lora=("llama",))  # an adapter named like its base


@pytest.mark.parametrize(("models", "loras", "expected"), [
    ("llama:2,qwen:1", "", [("llama-0", "llama", ()), ("llama-1", "llama", ()),
                            ("qwen-0", "qwen", ())]),
    ("llama:2", "llama:sql", [("llama-0", "llama", ("sql",)), ("llama-1", "llama", ("sql",))]),
    ("llama:2", "llama:sql:1,llama:x", [("llama-0", "llama", ("sql", "x")),
                                        ("llama-1", "llama", ("x",))]),  # sql on the first only
])
def test_mixed_fleet_plan(models: str, loras: str, expected: list[Any]) -> None:
    assert mixed_members(parse_models(models), parse_loras(loras)) == expected


@pytest.mark.parametrize(("models", "loras", "match"), [
    ("llama", "", "MODEL:REPLICAS"),
    ("llama:0", "", "MODEL:REPLICAS"),
    ("llama:1,llama:2", "", "twice"),
    ("llama:1", "qwen:sql", "not in --models"),
    ("llama:1", "llama", "MODEL:ADAPTER"),
])
def test_mixed_fleet_spec_errors(models: str, loras: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        mixed_members(parse_models(models), parse_loras(loras))
