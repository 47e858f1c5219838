"""A mixed fleet behind one router, through the official `openai` client: 2 models x 2 simulated
replicas (llama-0/1, qwen-0/1), adapter ``sql`` on llama-0 only and ``support`` on both llama
replicas, one LoRA slot each (``--max-lora 1``). Nothing tells the router who serves what: it
learns it from each replica's /v1/models."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from loadtest.fleet import Fleet, parse_loras, parse_models
from tests.integration.conftest import router_server, router_settings  # noqa: F401

SYSTEM = "You are the assistant of the billing team; answer in one short sentence. " * 6


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet.mixed(parse_models("llama:2,qwen:2"), parse_loras("llama:sql:1,llama:support"),
                     speed=20.0, max_lora=1) as f:
        yield f


def wait_for(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def routed(fleet: Fleet, router_server: Any) -> tuple[str, Any]:  # noqa: F811
    settings = router_settings(fleet.urls)
    data = settings.to_dict()
    for spec, name in zip(data["replicas"], fleet.names, strict=True):
        spec["name"] = name
    srv, app = router_server(type(settings).from_dict(data))
    wait_for(lambda: all(s.models is not None for s in app.replicas.states()),
             "every replica's model list")
    return str(srv.url), app


def client(url: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)


def ask(c: Any, model: str, user: str, team: int = 0) -> Any:
    return c.chat.completions.with_raw_response.create(
        model=model, max_tokens=2, messages=[{"role": "system", "content": f"Team {team}. {SYSTEM}"},
                                             {"role": "user", "content": user}])


def test_each_request_lands_on_a_replica_serving_its_model(routed: tuple[str, Any]) -> None:
    url, _ = routed
    c = client(url)
    serves = {"llama": {"llama-0", "llama-1"}, "qwen": {"qwen-0", "qwen-1"}, "sql": {"llama-0"},
              "support": {"llama-0", "llama-1"}}
    landed: dict[str, set[str]] = {m: set() for m in serves}
    for i in range(12):
        for model in serves:
            raw = ask(c, model, f"question {i}", team=i)
            answer = raw.parse()
            assert answer.model == model  # the replica ran the model (or adapter) asked for
            landed[model].add(raw.headers["x-prefix-router-replica"])
            assert answer.system_fingerprint == raw.headers["x-prefix-router-replica"]
    assert all(landed[m] <= serves[m] for m in serves), landed
    assert landed["llama"] == serves["llama"] and landed["qwen"] == serves["qwen"]


def test_unknown_model_is_a_404_in_openai_format(routed: tuple[str, Any]) -> None:
    url, app = routed
    prompt = "a secret prompt that must not come back"
    with pytest.raises(openai.NotFoundError) as err:
        ask(client(url), "mistral", prompt)
    body = err.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert body["type"] == "invalid_request_error"
    text = err.value.response.text
    assert prompt not in text and not any(n in text for n in app.replicas._states)
    ask(client(url), "llama", "hello")
    metrics = httpx.get(url + "/metrics").text
    assert 'prefix_router_rejected_total{reason="model_not_found"} 1.0' in metrics
    # labels stay bounded: the client's string never becomes one
    assert "mistral" not in metrics and 'model="llama"' in metrics


def test_models_is_the_union_deduplicated(routed: tuple[str, Any]) -> None:
    url, _ = routed
    listed = [(m.id, m.model_extra.get("parent")) for m in client(url).models.list().data]
    assert sorted(listed, key=str) == sorted([("llama", None), ("qwen", None), ("sql", "llama"),
                                              ("support", "llama")], key=str)


def test_an_adapters_requests_prefer_the_replica_that_has_it_loaded(
        fleet: Fleet, routed: tuple[str, Any]) -> None:
    url, app = routed
    # a long `support` request running on llama-1 (sent past the router): llama-1 has it loaded
    busy = httpx.Client(base_url=fleet.urls[1], timeout=60)
    stream = busy.stream("POST", "/v1/completions", json={
        "model": "support", "prompt": "keep running " * 30, "max_tokens": 4000, "stream": True})
    resp = stream.__enter__()
    try:
        llama1 = app.replicas.get("llama-1")
        wait_for(lambda: "support" in llama1.lora_running, "the router's scrape of llama-1")
        c = client(url)
        served = [ask(c, "support", "a ticket", team=i).headers["x-prefix-router-replica"]
                  for i in range(10)]
        assert served == ["llama-1"] * 10
    finally:
        resp.close()
        stream.__exit__(None, None, None)
        busy.close()
    # some of those ten had their ring home on llama-0 and were moved
    assert 'branch="lora_affinity"' in httpx.get(url + "/metrics").text


def test_killing_one_models_replicas_leaves_the_other_model_alone(
        fleet: Fleet, routed: tuple[str, Any]) -> None:
    url, _ = routed
    c = client(url)
    fleet.kill(2)
    fleet.kill(3)
    try:
        ok = [ask(c, "llama", f"still there {i}").parse().model for i in range(10)]
        assert ok == ["llama"] * 10
        with pytest.raises(openai.APIStatusError) as err:
            ask(c, "qwen", "anyone?")
        assert err.value.status_code == 503
        assert err.value.response.headers.get("retry-after")
        assert [ask(c, "sql", f"q{i}").parse().model for i in range(5)] == ["sql"] * 5
        text = httpx.get(url + "/metrics").text
        assert 'prefix_router_rejected_total{reason="no_replica"}' in text
    finally:
        fleet.restart(2)
        fleet.restart(3)
