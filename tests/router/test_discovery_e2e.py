"""End to end: the real router app with `discovery.type: kubernetes` against the fake API server,
fronting small upstream apps; after a readiness flip (or a terminating pod) no request reaches
the flipped replica, and it gets traffic back once ready again."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.app import create_app
from router.settings import Settings
from tests.conftest import ThreadedServer
from tests.deploy.discovery_runner import until
from tests.deploy.fake_kube import FakeKubeAPI, make_slice, pod_endpoint

DEADLINE = 15.0
PODS = ("up-0", "up-1", "up-2")


class Upstream:
    """An OpenAI-ish replica that counts the completions it serves."""

    def __init__(self, name: str, hits: Counter[str], lock: threading.Lock) -> None:
        self.name, self.hits, self.lock = name, hits, lock

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/health":
            body, status = b"{}", 200
        elif scope["path"] == "/v1/models":  # the router's health probes read it
            body, status = b'{"object": "list", "data": []}', 200
        elif scope["path"].startswith("/v1/"):
            with self.lock:
                self.hits[self.name] += 1
            body, status = json.dumps({"id": "x", "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": self.name},
                 "finish_reason": "stop"}]}).encode(), 200
        else:
            body, status = b"{}", 404
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[FakeKubeAPI, Any, str, Counter[str]]]:
    hits: Counter[str] = Counter()
    lock = threading.Lock()
    servers = [ThreadedServer(Upstream(p, hits, lock)).start() for p in PODS]
    api = FakeKubeAPI(token="t").start()
    router_srv = None
    try:
        for pod, srv in zip(PODS, servers, strict=True):  # one slice per pod: ports differ
            api.put_slice(make_slice(f"vllm-{pod}", "vllm", [pod_endpoint(pod, "127.0.0.1")],
                                     port=srv.port))
        settings = Settings.from_dict({
            "discovery": {"type": "kubernetes", "kubernetes": {
                "namespace": "default", "service": "vllm",
                "kubeconfig": api.write_kubeconfig(tmp_path / "kubeconfig")}},
            "scrape": {"enabled": False},
            "logging": {"access_log": False},
        })
        app = create_app(settings)
        router_srv = ThreadedServer(app).start()
        wait(lambda: len(app.replicas) == 3 and app.ready, "router sees 3 replicas")
        yield api, app, router_srv.url, hits
    finally:
        if router_srv is not None:
            router_srv.stop()
        api.stop()
        for srv in servers:
            srv.stop()


def wait(predicate: Any, what: str) -> float:
    return until(predicate, what, DEADLINE)


def send_many(url: str, n: int, tag: str) -> None:
    with httpx.Client(base_url=url, timeout=10) as client:
        for i in range(n):
            system = f"You are assistant number {i} for {tag}. " + "Follow the rules. " * 8
            r = client.post("/v1/chat/completions", json={"model": "m", "messages": [
                {"role": "system", "content": system}, {"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text


def draining(app: Any, name: str) -> bool:
    state = app.replicas.get(name)
    return state is not None and state.draining


def test_no_request_reaches_a_not_ready_or_terminating_pod(fleet: Any) -> None:
    api, app, url, hits = fleet
    send_many(url, 60, "warmup")
    assert set(hits) == set(PODS)  # every replica takes traffic while ready

    api.set_conditions("vllm-up-1", "up-1", ready=False)
    t = wait(lambda: draining(app, "up-1"), "readiness flip reaches the router")
    hits.clear()
    send_many(url, 60, "after flip")
    assert hits["up-1"] == 0 and sum(hits.values()) == 60
    print(f"readiness flip reached routing in {t * 1000:.1f} ms")

    api.set_conditions("vllm-up-1", "up-1", ready=True)
    wait(lambda: not draining(app, "up-1"), "ready again")
    api.set_conditions("vllm-up-2", "up-2", ready=False, serving=True, terminating=True)
    wait(lambda: draining(app, "up-2"), "terminating reaches the router")
    hits.clear()
    send_many(url, 60, "after terminating")
    assert hits["up-2"] == 0 and hits["up-1"] > 0

    api.delete_slice("vllm-up-2")
    wait(lambda: "up-2" not in app.replicas, "deleted pod leaves the membership")
