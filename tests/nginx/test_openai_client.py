"""End to end as documented in nginx/README.md: the `openai` client computes the key with
`router.client.hash_key`, nginx routes it to the simulated vLLM replica NginxRing names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from loadtest.replica import Replica, ReplicaConfig
from router.client import hash_key
from router.ring.nginx import NginxRing
from tests.conftest import ThreadedServer
from tests.nginx.harness import KEY_HEADER, NginxProcess, ring_of, running_nginx

pytestmark = pytest.mark.nginx


@pytest.fixture
def sim_nginx(tmp_path: Path) -> Iterator[tuple[NginxProcess, NginxRing]]:
    servers = [ThreadedServer(Replica(ReplicaConfig(name=f"sim-{i}", instant=True)))
               for i in range(3)]
    try:
        for server in servers:
            server.start()
        replicas = [(f"sim-{i}", s.url, 1 + i % 2) for i, s in enumerate(servers)]
        ring = ring_of(replicas)
        with running_nginx(tmp_path, replicas) as nginx:
            yield nginx, ring
    finally:
        for server in servers:
            server.stop()


def chat_body(tenant: int) -> dict[str, object]:
    system = f"You are the support assistant of tenant {tenant}. " + "Follow the policy. " * 20
    return {"model": "sim-model", "max_tokens": 4,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": f"question {tenant}"}]}


def test_openai_client_with_hash_key_lands_on_the_ring_home(
        sim_nginx: tuple[NginxProcess, NginxRing]) -> None:
    nginx, ring = sim_nginx
    client = openai.OpenAI(base_url=f"{nginx.url}/v1", api_key="unused", max_retries=0)
    homes = set()
    for tenant in range(12):
        body = chat_body(tenant)
        key = hash_key(body)
        assert key is not None
        raw = client.chat.completions.with_raw_response.create(
            **body, extra_headers={KEY_HEADER: key})  # type: ignore[call-overload]
        completion = raw.parse()
        assert completion.choices[0].message.content
        assert raw.headers["x-replica-name"] == ring.lookup(key)
        assert raw.headers["x-prefix-router-replica"] == ring.lookup(key)
        homes.add(ring.lookup(key))
    assert len(homes) > 1  # different prefixes really are spread


def test_openai_stream_through_nginx(sim_nginx: tuple[NginxProcess, NginxRing]) -> None:
    nginx, ring = sim_nginx
    body = chat_body(99)
    key = hash_key(body)
    assert key is not None
    client = openai.OpenAI(base_url=f"{nginx.url}/v1", api_key="unused", max_retries=0,
                           default_headers={KEY_HEADER: key})
    with client.chat.completions.with_streaming_response.create(
            **body, stream=True) as response:  # type: ignore[call-overload]
        assert response.headers["x-replica-name"] == ring.lookup(key)
        chunks = list(response.parse())
    assert len(chunks) >= 2
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
