"""The EPP process: grpc.health.v1 on the ext_proc port, /metrics on the admin listener, the
`prefix-router epp` command (a subprocess, stopped by SIGTERM)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loadtest._net import quiet_port
from loadtest.fleet import Fleet
from loadtest.gateway import EppThread, Gateway
from router.epp.service import EXT_PROC_SERVICE
from router.settings import Settings
from tests.conftest import wait_for, wait_for_port
from tests.router.epp.conftest import chat

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _status(port: int, service: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


@pytest.mark.parametrize("service", ["", "liveness", "readiness", EXT_PROC_SERVICE])
def test_health_is_served_on_the_ext_proc_port(epp: EppThread, service: str) -> None:
    wait_for(lambda: _status(epp.port, service) == SERVING, f"{service!r} SERVING")


def test_readiness_follows_the_replicas_and_liveness_does_not() -> None:
    dead = quiet_port()  # nothing listens there: the only replica fails its probes
    settings = Settings.from_dict({
        "replicas": [{"name": "gone", "url": f"http://127.0.0.1:{dead}"}],
        "epp": {"host": "127.0.0.1", "port": 0}, "logging": {"access_log": False},
        "health": {"interval": 0.2, "eject_after": 1, "timeout": 0.2}})
    with EppThread(settings) as epp:
        wait_for(lambda: _status(epp.port, "readiness") == NOT_SERVING, "readiness down")
        assert _status(epp.port, EXT_PROC_SERVICE) == NOT_SERVING
        assert _status(epp.port, "liveness") == SERVING
        gw = Gateway(epp.port)
        try:
            picked, resp, _ = gw.request("/v1/chat/completions", chat("anyone?"))
        finally:
            gw.close()
        assert picked.status == 503 and resp is None  # no replica: an immediate 503


def test_metrics_are_on_the_admin_listener(start_epp: Callable[..., EppThread]) -> None:
    admin = quiet_port()
    epp = start_epp(admin={"host": "127.0.0.1", "port": admin})
    gw = Gateway(epp.port)
    try:
        gw.request("/v1/chat/completions", chat("count me"))
    finally:
        gw.close()
    text = httpx.get(f"http://127.0.0.1:{admin}/metrics").text
    lines = [ln for ln in text.splitlines() if ln.startswith("prefix_router_requests_total{")]
    assert lines and sum(float(ln.rsplit(" ", 1)[1]) for ln in lines) == 1
    assert 'prefix_router_epp_decision_seconds_count{outcome="picked"} 1.0' in text
    assert httpx.get(f"http://127.0.0.1:{admin}/ready").status_code == 200


def test_the_epp_command_serves_until_sigterm(fleet: Fleet) -> None:
    port, admin = quiet_port(), quiet_port()
    argv = [sys.executable, "-m", "router", "epp", "--host", "127.0.0.1", "--port", str(port),
            "--admin-host", "127.0.0.1", "--admin-port", str(admin)]
    for url in fleet.urls:
        argv += ["--backend", url]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_for_port(port)
        wait_for(lambda: _status(port, "readiness") == SERVING, "readiness")
        gw = Gateway(port)
        try:
            picked, resp, _ = gw.request("/v1/chat/completions", chat("via the CLI"))
        finally:
            gw.close()
        assert picked.endpoints and resp is not None and resp.status_code == 200
        assert "prefix_router_requests_total{" in httpx.get(
            f"http://127.0.0.1:{admin}/metrics").text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=40) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_port_in_use_is_a_clear_error(fleet: Fleet) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "router", "epp", "--host", "127.0.0.1",
                            "--port", str(port), "--admin-port", str(quiet_port()),
                            "--admin-host", "127.0.0.1", "--backend", fleet.urls[0]],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"prefix-router epp: error: epp.port: cannot listen on 127.0.0.1:{port}" in r.stderr


def test_the_epp_command_without_replicas_exits_2() -> None:
    r = subprocess.run([sys.executable, "-m", "router", "epp"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "epp: no replicas" in r.stderr
