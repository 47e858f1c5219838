"""Prefill/decode disaggregation on two real vLLM CPU instances, with two KV connectors vLLM ships.

The router treats ``vllm0`` as the prefill instance and ``vllm1`` as the decode instance.

* ``NixlConnector`` (``kv_role: kv_both``, ``kv_buffer_device: cpu``; the env's ``nixl``
  package is the nixl-cu12 build, whose UCX backend moves CPU memory here, see docs/vllm.md):
  the prefill answers ``kv_transfer_params``, the router passes them on, and the decode
  instance's own ``vllm:nixl_xfer_time_seconds`` counts the transfer it made.
* ``ExampleConnector`` (the shared-storage connector: the producer writes each request's KV to
  ``shared_storage_path``, a consumer that meets the same prompt loads it): its prefill answer
  carries no ``kv_transfer_params`` (it needs none), so the router's outcome is
  ``no_kv_transfer``, and the decode instance's ``vllm:external_prefix_cache_hits`` shows that it
  loaded the KV the prefill instance stored instead of computing it.

Each test starts its own two instances (the shared session fleet has no connector).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtest.vllm_fleet import VllmEnv, VllmFleet
from tests.conftest import ThreadedServer, wait_for

from ._prompts import chat
from .conftest import MODEL, router_settings

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture
def pd_fleet(vllm_env: VllmEnv,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmFleet, Path]]:
    storage = tmp_path_factory.mktemp("kv-storage")
    config = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    fleet = VllmFleet(n=2, model_dir=vllm_env.model_dir, venv=vllm_env.venv, block_size=32,
                      served_model_name=MODEL, log_dir=tmp_path_factory.mktemp("pd-logs"),
                      extra_args=["--kv-transfer-config", json.dumps(config)])
    with fleet:
        yield fleet, storage


@pytest.fixture
def nixl_fleet(vllm_env: VllmEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmFleet]:
    config = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
    fleet = VllmFleet(n=2, model_dir=vllm_env.model_dir, venv=vllm_env.venv, block_size=32,
                      served_model_name=MODEL, log_dir=tmp_path_factory.mktemp("nixl-logs"),
                      extra_args=["--kv-transfer-config", json.dumps(config)], nixl=True)
    with fleet:
        yield fleet


def _external_hits(fleet: VllmFleet, i: int) -> float:
    return fleet.metrics(i).get("vllm:external_prefix_cache_hits_total", 0.0)


def _transfers(fleet: VllmFleet, i: int) -> float:
    return fleet.metrics(i).get("vllm:nixl_xfer_time_seconds_count", 0.0)


def _disaggregated(fleet: VllmFleet) -> Any:
    """The router app with vllm0 as the prefill instance and vllm1 as the decode instance."""
    from router.app import create_app

    settings = router_settings(fleet)
    data = settings.to_dict()
    data["replicas"][0]["role"] = "prefill"
    data["replicas"][1]["role"] = "decode"
    return create_app(type(settings).from_dict(data))


def test_nixl_connector_two_phases(nixl_fleet: VllmFleet, openai_client: Any,
                                   unique: str) -> None:
    app = _disaggregated(nixl_fleet)
    with ThreadedServer(app) as server:
        client = openai_client(server.url)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=chat(unique, "hello"), max_tokens=4,
            extra_body={"ignore_eos": True})
        done = raw.parse()
        assert raw.headers["x-prefix-router-replica"] == "vllm1"
        assert done.usage.completion_tokens == 4
        assert done.usage.prompt_tokens_details.cached_tokens == 0  # a cold prefill
        assert _transfers(nixl_fleet, 1) == 1 and _transfers(nixl_fleet, 0) == 0
        # the same prompt again, streamed: a prefix hit on the prefill instance, reported by
        # the decode instance (remote_prefill_cached_tokens), and a second transfer
        with client.chat.completions.with_streaming_response.create(
                model=MODEL, messages=chat(unique, "hello"), max_tokens=4, stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True}) as resp:
            assert resp.headers["x-prefix-router-replica"] == "vllm1"
            chunks = list(resp.parse())
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == 4
        assert usage.prompt_tokens_details.cached_tokens > 0
        assert _transfers(nixl_fleet, 1) == 2
        wait_for(lambda: app._open == 0, "the router's requests to end")  # outcome counted
        body, _ = app.metrics.render()
        outcomes = [line for line in body.decode().splitlines()
                    if line.startswith("prefix_router_disagg_requests_total{")]
        assert outcomes == ['prefix_router_disagg_requests_total{outcome="ok"} 2.0']


def test_shared_storage_connector_two_phases(pd_fleet: tuple[VllmFleet, Path],
                                             openai_client: Any, unique: str) -> None:
    fleet, storage = pd_fleet
    app = _disaggregated(fleet)
    with ThreadedServer(app) as server:
        client = openai_client(server.url)
        before = _external_hits(fleet, 1)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=chat(unique, "hello"), max_tokens=4,
            extra_body={"ignore_eos": True})
        done = raw.parse()
        assert raw.headers["x-prefix-router-replica"] == "vllm1"
        assert done.usage.completion_tokens == 4
        stored = list(storage.rglob("*.safetensors"))
        assert stored, "the prefill instance stored no KV"
        assert _external_hits(fleet, 1) > before  # the decode loaded it, not recomputed
        with client.chat.completions.with_streaming_response.create(
                model=MODEL, messages=chat(unique + "-s", "hello"), max_tokens=4, stream=True,
                extra_body={"ignore_eos": True}) as resp:
            assert resp.headers["x-prefix-router-replica"] == "vllm1"
            chunks = list(resp.parse())
        assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) >= 1
        wait_for(lambda: app._open == 0, "the router's requests to end")  # outcome counted
        body, _ = app.metrics.render()
        outcomes = [line for line in body.decode().splitlines()
                    if line.startswith("prefix_router_disagg_requests_total{")]
        assert outcomes == ['prefix_router_disagg_requests_total{outcome="no_kv_transfer"} 2.0']
