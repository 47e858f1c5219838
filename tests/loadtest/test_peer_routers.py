"""The peer routers of the benchmarks (`loadtest.setups`, the ``[compare]`` extra's pinned smg
and vllm-router) start in front of a simulated fleet and route to it: every request answered,
every one counted by a replica. vllm-router ``kv_aware`` is handed each replica's KV-event and
replay endpoints."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from loadtest.compare import FleetParams, setup_on_fleet
from loadtest.setups import SetupError, _vllm_kv_sources, parse_setup, tiny_tokenizer_dir

pytestmark = pytest.mark.slow

SYSTEM = "You are the assistant of the ACME billing team; answer in one sentence. " * 20


def replica_requests(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    m = re.search(r"^sim:requests_total\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize("name", ["smg-cache_aware", "vllm-cache_aware", "vllm-consistent_hash",
                                  "vllm-power_of_two", "vllm-kv_aware"])
def test_a_peer_router_routes_to_the_simulated_fleet(name: str, tmp_path: Path) -> None:
    setup = parse_setup(name)
    if setup.unavailable():  # the [compare] extra is part of `make install` (the test extra)
        pytest.fail(setup.unavailable() or "")
    tok = tiny_tokenizer_dir(tmp_path / "tok")
    params = FleetParams(replicas=2, kv_events=True)
    with setup_on_fleet(setup, params, tmp_path / "run", tok) as (fleet, launched):
        for i in range(4):
            body = {"model": "sim-model", "max_tokens": 4, "messages": [
                {"role": "system", "content": SYSTEM}, {"role": "user", "content": f"q{i}"}]}
            r = httpx.post(launched.url + "/v1/chat/completions", json=body, timeout=30)
            assert r.status_code == 200, (r.text[:300], launched.tail())
            assert r.json()["usage"]["prompt_tokens"] > 0
        assert sum(replica_requests(u) for u in fleet.urls) == 4


def test_vllm_kv_aware_gets_every_replicas_event_endpoints() -> None:
    replicas = [("a", "http://127.0.0.1:1", "tcp://127.0.0.1:11", "tcp://127.0.0.1:12"),
                ("b", "http://127.0.0.1:2", "tcp://127.0.0.1:21", "")]
    args = _vllm_kv_sources(parse_setup("vllm-kv_aware"), replicas)
    assert args == ["--kv-event-source", "http://127.0.0.1:1=tcp://127.0.0.1:11",
                    "--kv-event-replay-source", "http://127.0.0.1:1=tcp://127.0.0.1:12",
                    "--kv-event-source", "http://127.0.0.1:2=tcp://127.0.0.1:21",
                    "--kv-event-block-size", "16", "--kv-event-model", "sim-model"]
    with pytest.raises(SetupError, match="publishes no KV events"):
        _vllm_kv_sources(parse_setup("vllm-kv_aware"), [("a", "http://127.0.0.1:1")])
