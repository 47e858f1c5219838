from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtest._net import quiet_port
from router.cli import main
from router.client import hash_key
from tests.conftest import wait_for_port
from tests.integration.conftest import FakeReplica

BODY = {"model": "fake-model", "messages": [
    {"role": "system", "content": "You are a careful assistant for the support desk; be brief."},
    {"role": "user", "content": "hi"}]}


def run(argv: list[str], capsys: pytest.CaptureFixture[str],
        stdin: bytes | None = None, monkeypatch: pytest.MonkeyPatch | None = None
        ) -> tuple[int, str, str]:
    if stdin is not None:
        assert monkeypatch is not None
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("yaml_text", "message"), [
    ("routing:\n  load_factor: abc\n", "routing.load_factor: expected a number > 1, got 'abc'"),
    ("routing:\n  polcy: prefix\n", "routing.polcy: unknown key (value 'prefix')"),
    ("replicas:\n  - {name: r0, url: 'http://h:1', wieght: 2}\n", "replicas[0].wieght: unknown key"),
    ("proxy: [1]\n", "proxy: expected a mapping, got [1]"),
    ("listen: {port: 80\n", "invalid YAML"),
    ("routing: {}\n", "replicas: static discovery needs at least one replica"),
])
def test_serve_rejects_bad_config_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                yaml_text: str, message: str) -> None:
    cfg = tmp_path / "router.yaml"
    cfg.write_text(yaml_text)
    code, out, err = run(["serve", "--config", str(cfg)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and err.startswith("prefix-router: error: ")


def test_flags_are_validated_too(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["serve", "--backend", "localhost:8000"], capsys)
    assert code == 2 and "replicas[0].url" in err and "'localhost:8000'" in err
    code, _, err = run(["serve", "--backend", "http://127.0.0.1:1", "--port", "0"], capsys)
    assert code == 2 and "listen.port" in err


def test_check_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "router.yaml"
    cfg.write_text("replicas:\n  - {name: a, url: 'http://127.0.0.1:1'}\n")
    code, out, _ = run(["check-config", "--config", str(cfg)], capsys)
    assert code == 0 and "1 static replicas" in out


def test_hash_key_matches_the_client_library(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run(["hash-key"], capsys, json.dumps(BODY).encode(), monkeypatch)
    assert code == 0 and out.strip() == hash_key(BODY)
    completion = {"model": "fake-model", "prompt": "Summarise the following support ticket. " * 3}
    code, out, _ = run(["hash-key", "--path", "/v1/completions"], capsys,
                       json.dumps(completion).encode(), monkeypatch)
    assert code == 0 and out.strip() == hash_key(completion, "/v1/completions")
    assert out.strip() != hash_key(completion)  # the path matters


@pytest.mark.parametrize(("stdin", "code", "message"), [
    (b"{oops", 2, "stdin is not valid JSON"),
    (b"[1, 2]", 2, "expected a JSON object on stdin, got list"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', 1, "no prefix key"),
])
def test_hash_key_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                         stdin: bytes, code: int, message: str) -> None:
    got, out, err = run(["hash-key"], capsys, stdin, monkeypatch)
    assert got == code and out == "" and message in err


def test_nginx_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "router.yaml"
    cfg.write_text("replicas:\n  - {name: a, url: 'http://10.1.2.3:8000'}\n"
                   "  - {name: b, url: 'http://10.1.2.4:8000'}\n")
    code, out, _ = run(["nginx-config", "--config", str(cfg)], capsys)
    assert code == 0 and "10.1.2.3:8000" in out and "10.1.2.4:8000" in out
    target = tmp_path / "nginx.conf"
    code, _, _ = run(["nginx-config", "--config", str(cfg), "--out", str(target)], capsys)
    assert code == 0 and target.read_text() == out
    assert "events {" not in out and "listen 8080" in out  # a conf.d snippet by default
    code, full, _ = run(["nginx-config", "--config", str(cfg), "--standalone",
                         "--listen", "127.0.0.1:9099"], capsys)
    assert code == 0 and "events {" in full and "listen 127.0.0.1:9099" in full


def serve_process(args: list[str], port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "router", "serve", "--port", str(port),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for_port(port, timeout=30)
    except TimeoutError:
        proc.kill()
        raise AssertionError(proc.communicate()[0].decode()) from None
    return proc


def stop(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out.decode()


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_flag_form_end_to_end(threaded_server: Any, workers: int) -> None:
    fakes = [FakeReplica("a"), FakeReplica("b")]
    urls = [threaded_server(f.app()).url for f in fakes]
    port = quiet_port()
    proc = serve_process(["--backend", urls[0], "--backend", urls[1],
                          "--workers", str(workers), "--policy", "round_robin"], port)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while httpx.get(base + "/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        served = set()
        for _ in range(8):
            r = httpx.post(base + "/v1/chat/completions", json=BODY)
            assert r.status_code == 200
            served.add(r.json()["choices"][0]["message"]["content"])
        assert served == {"a", "b"}  # round robin, names from fake replicas
        metrics = httpx.get(base + "/metrics").text
        total = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                    if line.startswith("prefix_router_requests_total{"))
        assert total == 8  # with 2 workers: merged across processes
    finally:
        code, out = stop(proc)
    assert code == 0, out
    assert '"status":200' in out  # JSON access log lines on stdout
    assert "billing" not in out and "support desk" not in out


def test_sigterm_finishes_in_flight_requests_then_exits(threaded_server: Any) -> None:
    fake = FakeReplica("a")
    url = threaded_server(fake.app()).url
    port = quiet_port()
    proc = serve_process(["--backend", url], port)
    base = f"http://127.0.0.1:{port}"
    results: list[int] = []

    def slow() -> None:
        r = httpx.post(base + "/v1/chat/completions", json={**BODY, "stream": True},
                       headers={"x-fake-chunks": "5", "x-fake-chunk-delay": "0.3"}, timeout=30)
        results.append(r.status_code if r.text.rstrip().endswith("[DONE]") else -1)

    t = threading.Thread(target=slow)
    t.start()
    deadline = time.monotonic() + 10
    while fake.running == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    code, out = stop(proc)  # SIGTERM while the stream is running
    t.join(timeout=30)
    assert results == [200]  # the stream was finished, not cut
    assert code == 0, out
    assert "Waiting for application shutdown" in out
