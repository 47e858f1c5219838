"""Fixtures for the real-vLLM stage: one 2-replica fleet per session, a router in front of it.

The env (virtualenv + tiny model) comes from `make vllm-env`. When it is missing the tests are
skipped with a loud reason and a banner at the end of the run — unless CI is set or
PREFIX_ROUTER_VLLM_REQUIRED=1, where a missing env fails every test instead.

The fleet is started once (start-up dominates this stage's time). A test that kills a replica
leaves it dead; `fleet` restarts dead replicas before the next test that asks for it, so a kill
test placed last costs no restart.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from loadtest.vllm_fleet import VllmEnv, VllmEnvMissing, VllmFleet, find_env
from tests.conftest import ThreadedServer

MODEL = "tiny-llama"
_skipped_reason: list[str] = []


def _required() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("PREFIX_ROUTER_VLLM_REQUIRED") == "1"


@pytest.fixture(scope="session")
def vllm_env() -> VllmEnv:
    try:
        return find_env()
    except VllmEnvMissing as exc:
        if _required():
            pytest.fail(f"real vLLM env required here (CI / PREFIX_ROUTER_VLLM_REQUIRED=1): {exc}",
                        pytrace=False)
        reason = f"REAL vLLM TESTS SKIPPED — {exc}"
        if not _skipped_reason:
            _skipped_reason.append(reason)
        pytest.skip(reason)


# The fast suite's per-test timeout (pyproject: 120 s) is too short here: starting vLLM, or only
# `import vllm` in its env (~55 s on a loaded 2-core box), can take longer. A module that names
# no timeout of its own gets this one (test_kv_wire's setup once hit the 120 s under load).
STAGE_TIMEOUT = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that set RUN_LAST (they kill replicas) go last; the sort is stable otherwise.
    vLLM tests without a timeout marker get `STAGE_TIMEOUT`."""
    items.sort(key=lambda item: bool(getattr(getattr(item, "module", None), "RUN_LAST", False)))
    for item in items:
        if item.get_closest_marker("vllm") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(STAGE_TIMEOUT))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _skipped_reason:
        terminalreporter.write_sep("!", "REAL vLLM STAGE DID NOT RUN", red=True, bold=True)
        terminalreporter.write_line(_skipped_reason[0], red=True, bold=True)


@pytest.fixture(scope="session")
def _fleet(vllm_env: VllmEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmFleet]:
    log_dir = os.environ.get("PREFIX_ROUTER_VLLM_LOG_DIR") or tmp_path_factory.mktemp("vllm-logs")
    # KV cache events on (tests/vllm/test_kv_events.py subscribes; fleet.kv_endpoints)
    fleet = VllmFleet(n=2, model_dir=vllm_env.model_dir, venv=vllm_env.venv, block_size=32,
                      served_model_name=MODEL, log_dir=log_dir, kv_events=True)
    with fleet:
        print(f"\nvLLM fleet up in {fleet.startup_seconds:.1f}s: {fleet.urls} (logs {log_dir})")
        yield fleet


@pytest.fixture
def fleet(_fleet: VllmFleet) -> VllmFleet:
    for i in range(_fleet.n):
        if not _fleet.alive(i):
            took = _fleet.restart(i)
            print(f"\nrestarted {_fleet.names[i]} in {took:.1f}s")
    return _fleet


def router_settings(fleet: VllmFleet, **sections: Any) -> Any:
    from router.settings import Settings

    # Timeouts are generous: while a CPU replica generates, this process can get no CPU for
    # seconds at a time on a 2-core machine (measured up to 14 s), and a probe or connect that
    # times out then would eject a healthy replica in the middle of a test.
    data: dict[str, Any] = {
        "replicas": [{"name": n, "url": u} for n, u in zip(fleet.names, fleet.urls, strict=True)],
        "health": {"interval": 0.5, "timeout": 10.0, "eject_after": 2, "readmit_backoff": 0.5},
        "scrape": {"interval": 0.2},
        "proxy": {"connect_timeout": 10.0, "first_byte_timeout": 120.0, "max_attempts": 3},
        "logging": {"access_log": False},
    }
    for name, value in sections.items():
        data[name] = {**data.get(name, {}), **value}
    return Settings.from_dict(data)


@dataclass(frozen=True)
class RouterUnderTest:
    url: str
    app: Any  # router.app.RouterApp: its replica states and metrics are read directly


@pytest.fixture
def router(fleet: VllmFleet) -> Iterator[RouterUnderTest]:
    """A real router (in-process uvicorn on 127.0.0.1) in front of the fleet."""
    from router.app import create_app

    app = create_app(router_settings(fleet))
    with ThreadedServer(app) as server:
        yield RouterUnderTest(server.url, app)


@pytest.fixture
def openai_client() -> Callable[[str], Any]:
    import openai

    def make(base_url: str) -> Any:
        return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                             timeout=120.0)

    return make


@pytest.fixture
def unique() -> str:
    """A per-test marker to put at the very start of prompts: no other test's blocks can match."""
    return uuid.uuid4().hex
