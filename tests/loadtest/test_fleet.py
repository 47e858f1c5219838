"""Fleet start/stop by PID, chaos helpers, the `fleet` subcommand and the CLI table."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from loadtest import cli
from loadtest._net import http_ok, quiet_port
from loadtest.fleet import Fleet, FleetError
from loadtest.replica.config import ReplicaConfig, add_arguments, from_namespace, to_argv


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): it is gone for our purposes
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_fleet_starts_serves_and_stops_by_pid() -> None:
    with Fleet(replicas=3, speed=50.0) as fleet:
        pids = fleet.pids
        assert fleet.names == ["sim-0", "sim-1", "sim-2"]
        assert all(pid is not None and pid_alive(pid) for pid in pids)
        assert len(set(fleet.urls)) == 3
        for name, url in zip(fleet.names, fleet.urls, strict=True):
            r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert r.headers["x-replica-name"] == name and name in r.json()["id"]
        assert [fleet.stats(i)["pid"] for i in range(3)] == pids
    assert not any(pid_alive(p) for p in pids if p is not None)
    assert fleet.pids == [None, None, None]


def test_kill_and_restart_keep_the_port() -> None:
    base = quiet_port()
    with Fleet(replicas=1, base_port=base, speed=50.0, kv_blocks=64) as fleet:
        assert fleet.urls == [f"http://127.0.0.1:{base}"]
        old = fleet.pids[0]
        fleet.kill(0)
        assert not fleet.alive(0) and fleet.pids == [None]
        assert fleet.returncode(0) == -signal.SIGKILL
        with pytest.raises(httpx.ConnectError):
            httpx.get(fleet.urls[0] + "/health")
        fleet.restart(0)
        assert fleet.pids[0] not in (None, old)
        assert httpx.get(fleet.urls[0] + "/health").status_code == 200
        # options survive a restart
        assert 'num_gpu_blocks="64"' in httpx.get(fleet.urls[0] + "/metrics").text


def test_replica_options_are_validated_before_anything_starts() -> None:
    with pytest.raises(TypeError, match="unknown replica option"):
        Fleet(replicas=1, kv_block=5)
    with pytest.raises(TypeError, match="sets port"):
        Fleet(replicas=1, port=5)


def test_a_replica_that_cannot_start_fails_start_with_its_log() -> None:
    with pytest.raises(FleetError, match="exited"), Fleet(replicas=1, chat_template="/nonexistent.j2"):
        pass


def test_replica_options_round_trip_through_argv() -> None:
    options: dict[str, Any] = {"speed": 2.5, "instant": True, "preempt": False, "kv_blocks": 77,
               "chat_template": "t.j2", "fault_stop_after": 3}
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert from_namespace(parser.parse_args(to_argv(options))) == ReplicaConfig(**options)


def test_fleet_subcommand_runs_until_sigterm_and_stops_its_replicas() -> None:
    base = quiet_port(n=2)   # --base-port takes base and base + 1
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadtest", "fleet", "--replicas", "2", "--base-port", str(base),
         "--speed", "50"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        if not all(lines):   # the fleet ended before printing its replicas: say why
            proc.wait(timeout=20)
            pytest.fail(f"fleet exited with {proc.returncode}: "
                        f"{proc.stderr.read() if proc.stderr else ''}")
        assert [line.split("\t")[0] for line in lines] == ["sim-0", "sim-1"]
        urls = [line.split("\t")[1] for line in lines]
        assert urls == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
        pids = [httpx.get(line.split("admin ")[1].strip() + "/admin/stats").json()["pid"]
                for line in lines]
        assert all(pid_alive(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for _ in range(100):
        if not any(pid_alive(p) for p in pids):
            break
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in pids)


def test_future_subcommands_say_not_available(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert {"replica", "fleet", "run", "compare", "overhead", "simulate"} <= set(cli.SUBCOMMANDS)
    monkeypatch.setitem(cli.SUBCOMMANDS, "run",
                        cli.Subcommand("loadtest._not_written_yet", "drive a workload"))
    assert cli.main(["run"]) == 2
    assert "not available yet" in capsys.readouterr().err


def test_help_lists_every_subcommand_without_importing_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.SUBCOMMANDS)


def test_stop_also_ends_a_sigstopped_replica() -> None:
    fleet = Fleet(replicas=1, speed=50.0, stop_timeout=60.0).start()
    pid = fleet.pids[0]
    assert pid is not None
    fleet.kill(0, signal.SIGSTOP)
    assert fleet.alive(0)
    t0 = time.monotonic()
    fleet.stop()
    assert not pid_alive(pid)
    assert fleet.returncode(0) == -signal.SIGTERM   # the replica re-raises TERM after a clean stop
    assert time.monotonic() - t0 < 60        # did not sit out the whole grace period


def test_a_port_taken_between_its_pick_and_the_bind_is_picked_again() -> None:
    """Another process on the machine can take a port the fleet picked before its replica binds
    it: the replica exits ("Address already in use") and the fleet starts it on fresh ports."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        fleet = Fleet(replicas=2, speed=50.0)
        fleet._members[0].port = taken.getsockname()[1]   # as if taken in between
        fleet.start()
        try:
            assert taken.getsockname()[1] not in fleet.ports
            assert all(http_ok(u + "/health") for u in fleet.urls)
        finally:
            fleet.stop()
    with pytest.raises(FleetError, match="cannot listen"), socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        Fleet(replicas=1, base_port=taken.getsockname()[1]).start()  # a port asked for: no


def test_a_replica_whose_port_is_taken_says_so_and_exits_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "loadtest", "replica", "--name", "r9",
                               "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"prefix-loadtest replica r9: cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
