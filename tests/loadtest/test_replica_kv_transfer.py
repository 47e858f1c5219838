"""The simulated replica's disaggregated prefill (``--kv-transfer-config``, vLLM NixlConnector's
`kv_transfer_params`): config, the prefill's params, the decode's read, and every failure."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from loadtest.replica import Replica, ReplicaConfig
from loadtest.replica.engine import Engine, EngineLimits, EngineRequest
from loadtest.replica.kv_transfer import Ledger, TransferError, parse_kv_transfer_config
from loadtest.replica.timing import TimingModel

KV = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
MESSAGES = [{"role": "system", "content": "You answer for the ACME help desk. " * 30},
            {"role": "user", "content": "How do I reset my password?"}]
# what vLLM's toy proxy sends a prefill instance
PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
           "remote_block_ids": None, "remote_host": None, "remote_port": None}
HTTP = httpx.Client(timeout=30)


@pytest.fixture
def replica(threaded_server: Callable[..., Any]) -> Callable[..., str]:
    def start(**options: Any) -> str:
        options.setdefault("speed", 50.0)
        options.setdefault("kv_transfer_config", KV)
        srv = threaded_server(Replica(ReplicaConfig(name=options.pop("name", "sim"), **options)))
        return str(srv.url)

    return start


def chat(url: str, kv: dict[str, Any] | None, **body: Any) -> httpx.Response:
    payload: dict[str, Any] = {"model": "sim-model", "messages": MESSAGES, **body}
    if kv is not None:
        payload["kv_transfer_params"] = kv
    return HTTP.post(url + "/v1/chat/completions", json=payload)


def prefill(url: str) -> dict[str, Any]:
    r = chat(url, PREFILL, max_tokens=1, stream=False)
    assert r.status_code == 200, r.text
    params = r.json()["kv_transfer_params"]
    assert isinstance(params, dict)
    return params


@pytest.mark.parametrize(("text", "message"), [
    ("{", "--kv-transfer-config: not JSON"),
    ("[]", "--kv-transfer-config: expected a JSON object"),
    ('{"kv_connector": "NixlConnector", "kv_role": "kv_both", "x": 1}',
     "--kv-transfer-config: unknown key(s) x"),
    ('{"kv_connector": "NixlConnector"}', "--kv-transfer-config: kv_role: expected one of"),
    ('{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}',
     "--kv-transfer-config: kv_connector: expected one of NixlConnector (simulated)"),
    ('{"kv_connector": "NixlConnector", "kv_role": "kv_both", '
     '"kv_connector_extra_config": {"kv_lease_duration": 0}}',
     "--kv-transfer-config: kv_lease_duration: expected a valid value, got 0"),
])
def test_config_errors_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_kv_transfer_config(text)
    assert str(err.value).startswith(message)
    with pytest.raises(ValueError):  # the replica refuses it at start
        ReplicaConfig(kv_transfer_config=text)


def test_config_defaults_as_vllm() -> None:
    a, b = parse_kv_transfer_config(KV), parse_kv_transfer_config(KV)
    assert a.engine_id and a.engine_id != b.engine_id  # a fresh engine id per instance
    assert (a.kv_port, a.kv_load_failure_policy, a.lease_seconds) == (14579, "fail", 30.0)
    fixed = parse_kv_transfer_config('{"kv_connector": "NixlConnector", "kv_role": '
                                     '"kv_producer", "engine_id": "p0"}')
    assert fixed.engine_id == "p0"


def test_prefill_returns_nixl_params_and_decode_skips_the_prefill(
        replica: Callable[..., str]) -> None:
    p, d = replica(name="p"), replica(name="d")
    params = prefill(p)
    assert set(params) == {"do_remote_prefill", "do_remote_decode", "remote_block_ids",
                           "remote_engine_id", "remote_request_id", "remote_host",
                           "remote_port", "tp_size", "dcp_size", "pp_size",
                           "remote_num_tokens", "remote_blocks_expiry_time", "transfer_mode",
                           "remote_prefill_cached_tokens"}
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", int(p.rsplit(":", 1)[1]))
    n = params["remote_num_tokens"]
    assert len(params["remote_block_ids"]) == 1 and len(params["remote_block_ids"][0]) == -(-n // 16)
    # the decode instance, through the official client, streamed
    c = openai.OpenAI(base_url=d + "/v1", api_key="x", max_retries=0, timeout=30)
    stream = c.chat.completions.create(model="sim-model", messages=MESSAGES, max_tokens=6,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"kv_transfer_params": params})
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage.prompt_tokens == n
    assert usage.prompt_tokens_details.cached_tokens == 0  # the prefill's hits, as vLLM reports
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    stats = HTTP.get(d + "/admin/stats").json()
    assert stats["prefix_cache_hits"] == 0  # transferred, not a local prefix-cache hit
    metrics = HTTP.get(d + "/metrics").text
    assert f"vllm:external_prefix_cache_hits_total{{model_name=\"sim-model\"}} {n - 1}.0" in metrics
    assert HTTP.get(p + "/admin/stats").json()["prefix_cache_queries"] == n
    # a second prefill of the prompt hits the prefill's cache; the decode reports that hit
    warm = prefill(p)
    assert warm["remote_prefill_cached_tokens"] == (n - 1) // 16 * 16
    again = chat(d, warm, max_tokens=2).json()["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] == warm["remote_prefill_cached_tokens"]


def test_a_transfer_is_read_once(replica: Callable[..., str]) -> None:
    p, d = replica(name="p"), replica(name="d")
    params = prefill(p)
    assert chat(d, params, max_tokens=2).status_code == 200
    again = chat(d, params, max_tokens=2)
    assert again.status_code == 500
    assert "already read, lease expired or never prefilled" in again.json()["message"]


def test_decode_failures_are_error_responses(replica: Callable[..., str]) -> None:
    p, d = replica(name="p"), replica(name="d")
    params = prefill(p)
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"do_remote_prefill": True}, 400, "do_remote_prefill needs remote_engine_id"),
        ({**params, "remote_engine_id": "someone-else"}, 500, "unknown engine 'someone-else'"),
        ({**params, "remote_request_id": "chatcmpl-p-999"}, 500, "holds no KV here"),
        ({**params, "remote_block_ids": [[1, 2]]}, 500, "block ids do not match"),
        ({**params, "remote_port": 1}, 500, "unreachable"),
        ({**params, "remote_port": "x"}, 400, "malformed"),
    ]
    for kv, status, text in cases:
        r = chat(d, kv, max_tokens=2)
        assert r.status_code == status, (kv, r.text)
        assert text in r.json()["message"], r.text
    # another prompt's blocks: refused, and the transfer is spent
    other = chat(d, params, max_tokens=2, messages=[{"role": "user", "content": "x " * 400}])
    assert other.status_code == 409 and "not this prompt's" in other.json()["message"]


def test_without_a_connector_the_params_are_ignored(replica: Callable[..., str]) -> None:
    plain = replica(name="plain", kv_transfer_config=None)
    r = chat(plain, PREFILL, max_tokens=1)
    assert r.status_code == 200 and "kv_transfer_params" not in r.json()
    assert chat(plain, {"do_remote_prefill": True}, max_tokens=1).status_code == 200


def test_ledger_lease_expires() -> None:
    now = [0.0]
    ledger = Ledger(parse_kv_transfer_config(KV), "h", 1, clock=lambda: now[0])
    params = ledger.hold("r1", [11, 12], 40, 16)
    read = {"engine_id": params["remote_engine_id"], "request_id": "r1",
            "block_ids": params["remote_block_ids"][0]}
    now[0] = 31.0
    with pytest.raises(TransferError, match="lease expired"):
        ledger.read(read)
    ledger.hold("r2", [11], 20, 16)  # holding prunes what expired
    assert len(ledger) == 1


def test_engine_counts_remote_tokens_as_computed_once() -> None:
    async def main() -> tuple[int, int, int]:
        engine = Engine(EngineLimits(), TimingModel(speed=200.0))
        plan_tokens: list[int] = []
        engine.start()
        try:
            handle = engine.submit(EngineRequest("a", list(range(100)), 2, remote_tokens=100))
            plan_tokens.append(engine.schedule().prefill_tokens)
            engine.abort(handle._seq)  # type: ignore[attr-defined]
            usage = await engine.submit(EngineRequest("b", list(range(500, 600)), 2,
                                                      remote_tokens=100)).wait()
        finally:
            await engine.stop()
        return (plan_tokens[0], usage.cached_tokens, engine.stats.hits,
                engine.stats.external_hits)

    # one token computed; no local hit counted; 99 tokens from the remote prefill, twice
    assert asyncio.run(main()) == (1, 0, 0, 198)
