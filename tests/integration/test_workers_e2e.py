"""`prefix-router serve --workers N`: the workers of one process share their routing state by
default (sibling peers over ipc sockets the parent hands out), so a conversation's later turn
lands on the replica that served its earlier one whichever worker accepts its connection - as
with one worker. A real `python -m router serve` process in front of fake replicas; every
request on a fresh connection, so the kernel hands them to either worker.

What makes the check discriminating: one long system prompt shared by every conversation, so
every first turn has the same home; the first turns arrive together and slow, so their load
spreads them over the replicas, and a later turn (alone, the fleet idle) can find its replica
only in the index of the worker that served the first turn - or, shared, in every worker's.
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from loadtest._net import quiet_port
from tests.router.test_cli import serve_process, stop

SYSTEM = "You are the support assistant of the ACME billing platform. " * 40  # ~600 tokens
CONVERSATIONS = 24


def chat(base: str, messages: list[dict[str, str]], delay: float = 0.0) -> tuple[str, str]:
    """One request on its own connection: (the replica that served it, its answer)."""
    with httpx.Client(timeout=30) as client:
        r = client.post(base + "/v1/chat/completions", headers={"x-fake-delay": str(delay)},
                        json={"model": "fake-model", "messages": messages})
    assert r.status_code == 200, r.text
    return r.headers["x-prefix-router-replica"], r.json()["choices"][0]["message"]["content"]


def served_events_applied(base: str) -> float:
    """Sibling `served` events applied, summed over the workers (multiprocess metrics)."""
    text = httpx.get(base + "/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "prefix_router_peer_events_received_total"
               and s.labels == {"type": "served", "applied": "true"})


def start(fake_fleet: Any, tmp_path: Path, workers: int, **peers: Any
          ) -> tuple[subprocess.Popen[bytes], str]:
    fleet = fake_fleet(4)
    config = {"replicas": [{"name": f"r{i}", "url": u} for i, u in enumerate(fleet.urls)],
              "routing": {"policy": "cache_aware", "peers": {"heartbeat": 0.2, **peers}},
              "health": {"interval": 0.2}, "scrape": {"interval": 0.2},
              "logging": {"access_log": False}}
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(config))
    port = quiet_port()
    proc = serve_process(["--config", str(path), "--workers", str(workers)], port)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while httpx.get(base + "/ready").status_code != 200:
        assert time.monotonic() < deadline, "router not ready"
        time.sleep(0.1)
    return proc, base


def conversations(base: str) -> list[tuple[str, str]]:
    """Each conversation's (first-turn replica, second-turn replica): the first turns at once
    and slow (their load spreads them over the replicas), then each second turn alone."""
    firsts = [[{"role": "system", "content": SYSTEM},
               {"role": "user", "content": f"Customer {i}: why was my invoice {i} charged twice?"}]
              for i in range(CONVERSATIONS)]
    with ThreadPoolExecutor(CONVERSATIONS) as pool:
        answered = list(pool.map(lambda m: chat(base, m, delay=1.0), firsts))
    out = []
    for first, (where, answer) in zip(firsts, answered, strict=True):
        second = [*first, {"role": "assistant", "content": answer},
                  {"role": "user", "content": "And when will the refund arrive?"}]
        out.append((where, chat(base, second)[0]))
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_a_conversation_follows_its_history_whichever_worker_accepts_it(
        fake_fleet: Any, tmp_path: Path, workers: int) -> None:
    proc, base = start(fake_fleet, tmp_path, workers)
    try:
        if workers > 1:  # both workers up and subscribed to each other before the traffic
            deadline = time.monotonic() + 20
            while served_events_applied(base) == 0 and time.monotonic() < deadline:
                chat(base, [{"role": "user", "content": "warm-up"}])
        turns = conversations(base)
        applied = served_events_applied(base)
    finally:
        code, out = stop(proc)
    assert code == 0, out
    assert len({first for first, _ in turns}) > 1  # the first turns spread: the check can fail
    moved = [(i, a, b) for i, (a, b) in enumerate(turns) if a != b]
    assert moved == []  # every second turn on its first turn's replica
    if workers > 1:  # and the other worker served some of them: it learnt them from its sibling
        assert applied >= CONVERSATIONS // 2, out
