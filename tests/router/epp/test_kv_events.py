"""With `routing.kv_events` the EPP's index learns from vLLM's own KV events (simulated
replicas publishing over ZMQ): no response phase needed, as docs/gateway.md says."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from loadtest.fleet import Fleet
from loadtest.gateway import EppThread, Gateway
from router.replicas import address_of
from router.settings import Settings
from tests.conftest import wait_for
from tests.router.epp.conftest import all_idle, chat

CFG = json.dumps({"enable_kv_cache_events": True, "topic": "kv", "endpoint": "tcp://*:0",
                  "replay_endpoint": "tcp://*:0"})


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet(replicas=3, instant=True, block_size=16, kv_blocks=256,
               kv_events_config=CFG) as f:
        yield f


def test_kv_events_fill_the_index_without_the_response_phase(fleet: Fleet) -> None:
    replicas = [{"name": n, "url": u, "kv_events_endpoint": e, "kv_replay_endpoint": r}
                for n, u, e, r in zip(fleet.names, fleet.urls, fleet.kv_endpoints,
                                      fleet.kv_replay_endpoints, strict=True)]
    settings = Settings.from_dict({
        "replicas": replicas, "epp": {"host": "127.0.0.1", "port": 0},
        "routing": {"policy": "cache_aware", "kv_events": {"enabled": True, "topic": "kv"}},
        "health": {"interval": 0.2, "timeout": 0.5}, "scrape": {"interval": 0.2},
        "logging": {"access_log": False}})
    with EppThread(settings) as epp:
        core = epp.server.core
        wait_for(lambda: epp.run(lambda: all(s.models is not None
                                             for s in core.replicas.states())), "model lists")
        gw = Gateway(epp.port, response_phase=False)
        try:
            body = chat("what does the contract say about renewals?")
            _, resp, served = gw.request("/v1/chat/completions", body)
            assert resp is not None and resp.status_code == 200 and served is not None
            name = epp.run(lambda: next(s.name for s in core.replicas.states()
                                        if address_of(s.url) == served))
            # the replica's engine reports its new blocks; the index holds what it holds
            wait_for(lambda: epp.run(lambda: core.router.index.used(name)) > 0,
                     "the KV events of the served replica")
            assert epp.run(lambda: sum(core.router.index.used(s.name)
                                       for s in core.replicas.states())) == \
                epp.run(lambda: core.router.index.used(name))
            # the repeat goes where the blocks are, and is a cache hit there
            _, again, served_again = gw.request("/v1/chat/completions", body)
            assert served_again == served and again is not None
            assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        finally:
            gw.close()
        wait_for(lambda: all_idle(epp), "attempts released")
