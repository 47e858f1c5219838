"""Harness for the reliability suites: a router *process*, simulated fleets, probes of both.

Everything runs on 127.0.0.1 with kernel-assigned ports. A router under test is started as
``python -m router serve --config FILE`` (its own process, so it can be SIGKILLed, SIGTERMed, its
RSS read and its sockets counted from /proc) and stopped by PID. Fleets are `loadtest.fleet.Fleet`
(one process per simulated replica).

Measurements: tests call ``measure(scenario, **values)``; when ``RELIABILITY_RESULTS`` names a
file, the session writes every measurement there as JSON (`scripts/reliability_report.py` turns it
into docs/reliability.md). ``RELIABILITY_SCALE`` (default 1) multiplies the counts of the load
loops through `scaled()`, so the report runs the very same assertions at larger sizes.

Timing promises ("every abort within 100 ms") are measured figures, not pass/fail facts on a
shared 2-core machine: a test states one with `promise(name, value, limit)`, which records the
value and whether it was kept; it fails the test only where ``RELIABILITY_PROMISES=1`` (set by
`scripts/reliability_report.py`, which runs under ``flock /work/.bench.lock``), never in
`make test`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from loadtest._net import quiet_port
from loadtest.fleet import Fleet

REPO = Path(__file__).resolve().parents[2]
SCALE = float(os.environ.get("RELIABILITY_SCALE", "1"))
PROMISES = os.environ.get("RELIABILITY_PROMISES") == "1"
_RESULTS: dict[str, dict[str, Any]] = {}

# Health settings for the tests about ejection (test_chaos): short intervals and timeouts, so
# ejection and readmission take about a second.
FAST_HEALTH = {"interval": 0.25, "timeout": 0.5, "eject_after": 2, "readmit_backoff": 0.25,
               "readmit_backoff_max": 1.0}
# Everyone else's default: upstreams that are healthy by construction are never ejected. An
# upstream served from the test process shares its GIL with the test's own clients, so on a
# loaded machine a probe can wait past FAST_HEALTH's 0.5 s twice: the router ejected the only
# replica and test_security's label-cardinality run got 503 "no healthy replica" midway.
STEADY_HEALTH = {"interval": 1.0, "timeout": 30.0, "eject_after": 1000}


def scaled(n: int) -> int:
    return max(1, round(n * SCALE))


# -- measurements ----------------------------------------------------------------------------------
def promise(record: Callable[..., None], scenario: str, name: str, value: float,
            limit: float) -> None:
    """Record ``value`` (seconds) against its promised ``limit`` as ``<name>_promise_kept``;
    assert it only in a report run (``RELIABILITY_PROMISES=1``, see the module docstring)."""
    record(scenario, **{f"{name}_seconds": round(value, 4), f"{name}_limit_seconds": limit,
                        f"{name}_promise_kept": value <= limit})
    if PROMISES:
        assert value <= limit, f"{scenario}: {name} took {value:.3f}s, promised {limit}s"


@pytest.fixture(scope="session")
def measure() -> Iterator[Callable[..., None]]:
    def record(scenario: str, **values: Any) -> None:
        _RESULTS.setdefault(scenario, {}).update(values)

    yield record
    out = os.environ.get("RELIABILITY_RESULTS")
    if out:
        previous: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            previous = json.loads(Path(out).read_text())
        previous.update(_RESULTS)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(previous, indent=2, sort_keys=True))


# -- /proc probes ----------------------------------------------------------------------------------
def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


@dataclass(frozen=True)
class TcpSocket:
    local_port: int
    remote_port: int
    state: str


def established(pid: int, *, local_port: int | None = None,
                remote_ports: frozenset[int] | None = None) -> list[TcpSocket]:
    """ESTABLISHED TCP sockets owned by `pid`, read from /proc (no psutil): the netns-wide
    tables /proc/<pid>/net/tcp{,6} joined with the socket inodes in /proc/<pid>/fd."""
    return _tcp_sockets(pid, "01", local_port, remote_ports)  # 01 = TCP_ESTABLISHED


def listens(pid: int, port: int) -> bool:
    """Whether `pid` itself holds a listening socket on `port` (not another process)."""
    return bool(_tcp_sockets(pid, "0A", port, None))  # 0A = TCP_LISTEN


def _tcp_sockets(pid: int, state: str, local_port: int | None,
                 remote_ports: frozenset[int] | None) -> list[TcpSocket]:
    mine = _socket_inodes(pid)
    out = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] != state or cols[9] not in mine:
                    continue
                lport = int(cols[1].rsplit(":", 1)[1], 16)
                rport = int(cols[2].rsplit(":", 1)[1], 16)
                if local_port is not None and lport != local_port:
                    continue
                if remote_ports is not None and rport not in remote_ports:
                    continue
                out.append(TcpSocket(lport, rport, cols[3]))
    return out


# -- metrics ---------------------------------------------------------------------------------------
def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, dict(s.labels), s.value)
            for fam in text_string_to_metric_families(text) for s in fam.samples]


def metric(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples
               if n == name and all(lab.get(k) == want for k, want in labels.items()))


# -- the router process ----------------------------------------------------------------------------
def router_config(urls: list[str], names: list[str] | None = None,
                  **sections: dict[str, Any]) -> dict[str, Any]:
    names = names or [f"sim-{i}" for i in range(len(urls))]
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": quiet_port()},
        "replicas": [{"name": n, "url": u} for n, u in zip(names, urls, strict=True)],
        "health": dict(STEADY_HEALTH),
        "scrape": {"interval": 0.25, "enabled": False},
        "proxy": {"connect_timeout": 0.5, "first_byte_timeout": 5.0, "idle_timeout": 1.0,
                  "max_attempts": 3},
        "logging": {"level": "info", "access_log": False},
        "shutdown": {"grace_period": 5.0},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


@dataclass
class RouterProcess:
    config: dict[str, Any]
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        return int(self.config["listen"]["port"])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        admin = self.config.get("admin") or {}
        port = admin.get("port") or self.port
        return f"http://{admin.get('host') or '127.0.0.1'}:{port}/metrics"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def stdout_path(self) -> Path:
        return self.workdir / "router.stdout"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / "router.stderr"

    def output(self) -> str:
        return (self.stdout_path.read_text(errors="replace")
                + self.stderr_path.read_text(errors="replace"))

    def start(self, timeout: float = 20.0, attempts: int = 3) -> RouterProcess:
        """Start the router and wait until it answers /health on a socket it listens on itself.

        Its ports come from `quiet_port()` and are bound only once the process runs: another
        suite on the machine can take one in between. Then the router exits ("address already
        in use") and is started again on fresh ports, up to `attempts` times; and a /health
        answered by that other process never counts as this router being up."""
        for _ in range(attempts):
            if self._start_once(timeout):
                return self
            self.config["listen"]["port"] = quiet_port()
            if (self.config.get("admin") or {}).get("port"):
                self.config["admin"]["port"] = quiet_port()
        raise RuntimeError(f"router could not bind free ports in {attempts} tries:\n"
                           f"{self.output()}")

    def _start_once(self, timeout: float) -> bool:
        """True once up; False if it exited because a port was taken; raises otherwise."""
        path = self.workdir / "router.yaml"
        path.write_text(yaml.safe_dump(self.config))
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "router", "serve", "--config", str(path)],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if "address already in use" in self.output().lower():
                    return False
                raise RuntimeError(f"router exited with {self.proc.returncode}:\n{self.output()}")
            with contextlib.suppress(httpx.HTTPError, OSError):
                admin = (self.config.get("admin") or {}).get("port")
                if (listens(self.pid, self.port) and (not admin or listens(self.pid, admin))
                        and httpx.get(self.url + "/health", timeout=0.5).status_code == 200):
                    return True
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"router not up after {timeout}s:\n{self.output()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        return self.proc.returncode

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        return parse_metrics(httpx.get(self.metrics_url, timeout=5).text)

    def healthy(self, replica: str) -> bool:
        return metric(self.samples(), "prefix_router_replica_healthy", replica=replica) == 1


@pytest.fixture
def start_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., RouterProcess]]:
    started: list[RouterProcess] = []

    def start(config: dict[str, Any], env: dict[str, str] | None = None) -> RouterProcess:
        r = RouterProcess(config, tmp_path_factory.mktemp("router"), env or {})
        started.append(r)
        return r.start()

    yield start
    for r in reversed(started):
        r.stop()


@pytest.fixture
def start_fleet() -> Iterator[Callable[..., Fleet]]:
    started: list[Fleet] = []

    def start(replicas: int, **options: Any) -> Fleet:
        fleet = Fleet(replicas=replicas, **options)
        started.append(fleet)
        return fleet.start()

    yield start
    for fleet in reversed(started):
        for i in range(len(fleet)):
            if fleet.alive(i):
                # a SIGSTOPped replica would ignore the fleet's SIGTERM until its grace ran out
                with contextlib.suppress(ProcessLookupError):
                    pid = fleet.pids[i]
                    if pid is not None:
                        os.kill(pid, signal.SIGCONT)
        fleet.stop()


def wait_until(check: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.02) -> float:
    """Seconds until `check()` held; AssertionError after `timeout`."""
    t0 = time.monotonic()
    while True:
        with contextlib.suppress(httpx.HTTPError, OSError):
            if check():
                return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
