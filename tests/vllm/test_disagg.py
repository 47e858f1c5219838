"""Prefill/decode disaggregation on two real vLLM CPU instances with a KV connector vLLM ships.

NixlConnector needs the ``nixl`` package, which PyPI ships only as CUDA builds (docs/vllm.md);
vLLM's ``ExampleConnector`` (the shared-storage connector: the producer writes each request's KV
to ``shared_storage_path``, a consumer that meets the same prompt loads it from there) runs on
CPU. Both instances run it with ``kv_role: kv_both`` over one directory; the router treats
``vllm0`` as the prefill instance and ``vllm1`` as the decode instance. Its prefill answer carries
no ``kv_transfer_params`` (that connector needs none), so the router's outcome is
``no_kv_transfer`` - and the decode instance's own ``vllm:external_prefix_cache_hits`` shows
that it loaded the prompt's KV the prefill instance stored instead of computing it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtest.vllm_fleet import VllmEnv, VllmFleet
from tests.conftest import ThreadedServer

from ._prompts import chat
from .conftest import MODEL, router_settings

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
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


def _external_hits(fleet: VllmFleet, i: int) -> float:
    return fleet.metrics(i).get("vllm:external_prefix_cache_hits_total", 0.0)


def test_two_phases_on_real_vllm(pd_fleet: tuple[VllmFleet, Path], openai_client: Any,
                                 unique: str) -> None:
    from router.app import create_app

    fleet, storage = pd_fleet
    settings = router_settings(fleet)
    data = settings.to_dict()
    data["replicas"][0]["role"] = "prefill"
    data["replicas"][1]["role"] = "decode"
    app = create_app(type(settings).from_dict(data))
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
        body, _ = app.metrics.render()
        assert b'prefix_router_disagg_requests_total{outcome="no_kv_transfer"} 2.0' in body
