"""One upstream per model: the router (``routing.ring: nginx``) and nginx rendered from the same
settings send every header-keyed request of every model to the same replica, and both answer a
model no replica serves with the same 404."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest

from router.app import create_app
from router.client import MODEL_HEADER, routing_headers
from router.nginx_config import render
from router.settings import Settings
from tests.conftest import ThreadedServer
from tests.nginx.harness import KEY_HEADER, nginx_fleet, ring_parity_setup

pytestmark = pytest.mark.nginx

SERVES = {"r0": ["llama", "sql"], "r1": ["llama"], "r2": ["qwen"], "r3": ["llama", "qwen"]}


def placements(port: int, model: str, keys: list[str]) -> dict[str, str]:
    out = {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for key in keys:
            body = json.dumps({"model": model, "prompt": "hi"})
            conn.request("POST", "/v1/completions", body=body, headers={
                KEY_HEADER: key, MODEL_HEADER: model, "Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            assert response.status == 200, (model, key, response.status)
            out[key] = response.headers["x-replica-name"]
    finally:
        conn.close()
    return out


def answer(port: int, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/completions", body=b'{"model": "mistral", "prompt": "secret"}',
                     headers={"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_router_and_nginx_agree_per_model(tmp_path: Path) -> None:
    keys = [f"model-key-{i}" for i in range(150)]
    with nginx_fleet(tmp_path / "backends", [1, 1, 2, 1]) as replicas:
        settings, nginx = ring_parity_setup(tmp_path / "front", replicas, SERVES)
        try:
            with ThreadedServer(create_app(settings)) as router:
                via_router = {m: placements(router.port, m, keys) for m in ("llama", "qwen", "sql")}
                router_404 = answer(router.port, {MODEL_HEADER: "mistral"})
            via_nginx = {m: placements(nginx.port, m, keys) for m in ("llama", "qwen", "sql")}
            nginx_404 = answer(nginx.port, {MODEL_HEADER: "mistral"})
            nginx_no_header = answer(nginx.port, {})
        finally:
            nginx.stop()
    for model, placed in via_nginx.items():
        pool = {n for n, served in SERVES.items() if model in served}
        assert set(placed.values()) == pool  # every replica of the pool, and only those
        assert {k for k in keys if via_router[model][k] != placed[k]} == set(), model
    assert nginx_404 == router_404 == nginx_no_header
    assert router_404[0] == 404 and router_404[1]["error"]["code"] == "model_not_found"  # type: ignore[index]


def test_routing_headers_carry_the_model_for_nginx() -> None:
    body = {"model": "sql", "messages": [{"role": "system", "content": "S" * 100}]}
    headers = routing_headers(body)
    assert headers[MODEL_HEADER] == "sql" and KEY_HEADER in headers
    assert routing_headers({"messages": []}) == {}
    assert routing_headers(b"{not json") == {}


@pytest.mark.parametrize(("serves", "match"), [
    ({"r0": ["llama"], "r1": None}, r"replicas\[1\]\.models"),  # nginx cannot learn one
    ({"r0": ["llama x"], "r1": ["llama"]}, "model name"),  # would break out of the map key
    ({"r0": ['a";'], "r1": ["llama"]}, "model name"),
])
def test_models_nginx_cannot_carry_are_refused(serves: dict[str, list[str] | None],
                                               match: str) -> None:
    settings = Settings.from_dict({"replicas": [
        {"name": n, "url": f"http://127.0.0.1:{9000 + i}", "models": m}
        for i, (n, m) in enumerate(serves.items())]})
    with pytest.raises(ValueError, match=match):
        render(settings)
