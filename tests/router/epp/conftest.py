"""Fixtures for the endpoint picker: one simulated vLLM fleet per module (real replica
processes on 127.0.0.1, `loadtest.fleet.Fleet`), a fresh EPP per test (`loadtest.gateway.
EppThread`: a real grpc.aio server on 127.0.0.1, its own event loop) and a gateway that speaks
to it with Envoy's own protos (`loadtest.gateway`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub

from loadtest.fleet import Fleet
from loadtest.gateway import EppThread, ExtProcStream
from router.replicas import address_of
from router.settings import Settings
from tests.conftest import wait_for

SYSTEM = ("You are the ACME help desk assistant. Answer in two sentences, cite the policy "
          "section you used, and never promise refunds. ")


def chat(user: str, system: str = SYSTEM, history: list[dict[str, str]] | None = None,
         model: str = "sim-model", **extra: Any) -> bytes:
    messages = [{"role": "system", "content": system * 4}, *(history or []),
                {"role": "user", "content": user}]
    return json.dumps({"model": model, "messages": messages, "max_tokens": 4,
                       **extra}).encode()


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet(replicas=4, instant=True) as f:
        yield f


def epp_settings(fleet: Fleet, **sections: Any) -> Settings:
    doc: dict[str, Any] = {
        "replicas": [{"name": n, "url": u} for n, u in zip(fleet.names, fleet.urls, strict=True)],
        "epp": {"host": "127.0.0.1", "port": 0}, "logging": {"access_log": False}}
    for name, value in sections.items():
        doc[name] = {**doc.get(name, {}), **value}
    return Settings.from_dict(doc)


@pytest.fixture
def start_epp(fleet: Fleet) -> Iterator[Callable[..., EppThread]]:
    started: list[EppThread] = []

    def start(**sections: Any) -> EppThread:
        epp = EppThread(epp_settings(fleet, **sections)).start()
        started.append(epp)
        # the model lists are learned with the first health probe: until then every model
        # is routed model-blind (no 404 yet)
        wait_for(lambda: epp.run(lambda: all(
            s.models is not None for s in epp.server.core.replicas.states())), "model lists")
        return epp

    yield start
    for epp in started:
        epp.stop()


@pytest.fixture
def epp(start_epp: Callable[..., EppThread]) -> EppThread:
    return start_epp()


def open_stream(epp: EppThread) -> tuple[grpc.Channel, ExtProcStream]:
    channel = grpc.insecure_channel(f"127.0.0.1:{epp.port}")
    return channel, ExtProcStream(ExternalProcessorStub(channel))


def addresses(fleet: Fleet) -> list[str]:
    return [address_of(u) for u in fleet.urls]


def idle(epp: EppThread) -> dict[str, tuple[int, int, float]]:
    """Every replica's in-flight count, unstarted requests and queued prefill (all zero when
    no request is open), plus the in-flight prefix set's size under the key ``_prefixes``."""
    def read() -> dict[str, tuple[int, int, float]]:
        core = epp.server.core
        out = {s.name: (s.in_flight, s.unstarted, s.pending_prefill)
               for s in core.replicas.states()}
        out["_prefixes"] = (len(core.router.in_flight), 0, 0.0)
        return out
    return epp.run(read)  # type: ignore[no-any-return]


def all_idle(epp: EppThread) -> bool:
    return all(v == (0, 0, 0.0) for v in idle(epp).values())
