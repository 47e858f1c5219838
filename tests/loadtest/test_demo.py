"""The quick start (`make run`): the router in front of a simulated fleet, as a user starts it.

`prefix-router serve` with no replicas and `prefix-loadtest demo` are the same composition
(`loadtest.demo`); `python -m router serve` alone, the router without the load-test kit, says
how to get replicas instead of reaching for them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from loadtest._net import http_ok, quiet_port
from loadtest.demo import DEMO_REPLICAS

BIN = Path(sys.executable).parent


def _chat(base: str) -> tuple[int, str, dict[str, object]]:
    body = json.dumps({"model": "sim-model", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.headers["x-prefix-router-replica"], json.loads(resp.read())


@pytest.mark.parametrize("command", [["prefix-router", "serve"], ["prefix-loadtest", "demo"]])
def test_the_quick_start_serves_and_stops_its_fleet(command: list[str], tmp_path: Path) -> None:
    port = quiet_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "out.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(BIN / command[0]), *command[1:], "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not http_ok(f"{base}/ready") and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        status, replica, answer = _chat(base)
        assert status == 200 and answer["object"] == "chat.completion"
        banner = log.read_text()
        assert f"{DEMO_REPLICAS} simulated vLLM replicas" in banner and f"router on {base}" in banner
        listed = banner.split("(", 1)[1].split(")", 1)[0].split(", ")  # "sim-0=http://..."
        fleet = dict(part.split("=", 1) for part in listed)
        urls = list(fleet.values())
        assert len(fleet) == DEMO_REPLICAS and replica in fleet
        assert all(http_ok(f"{u}/health") for u in urls)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
        # the replicas went with the router
        assert not any(http_ok(f"{u}/health", timeout=0.5) for u in urls)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_router_alone_asks_for_replicas() -> None:
    result = subprocess.run([sys.executable, "-m", "router", "serve"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert "no replicas; pass --config or --backend" in result.stderr
    assert "prefix-loadtest demo" in result.stderr
