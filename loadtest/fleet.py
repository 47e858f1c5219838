"""A fleet of simulated replicas, one process each, managed by PID.

    with Fleet(replicas=4, speed=10) as fleet:     # replica options are ReplicaConfig fields
        fleet.urls      # ["http://127.0.0.1:41231", ...]
        fleet.names     # ["sim-0", ..., "sim-3"]
        fleet.kill(1)   # SIGKILL replica 1 (chaos); fleet.restart(1) brings it back, same port
        fleet.fault(2, error_rate=1.0, error_status=503)   # POST /admin/fault on its admin port

Replica ``i`` runs ``python -m loadtest replica --name NAME --port PORT --admin-port A ...`` in
its own session (so a terminal's Ctrl-C reaches only the fleet, which then stops its children in
order); ports are ``base_port + i`` or, without a base port, ports the kernel hands out. `start()`
returns once every replica answers ``GET /health`` (a replica that exits or misses the deadline
fails it with the tail of its log). `stop()` sends SIGTERM to each PID, waits up to a grace period
for all, then SIGKILLs the rest. The `fleet` subcommand wraps the same class and stops on
SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, fields
from pathlib import Path
from types import TracebackType
from typing import Any

from loadtest._net import free_port, http_ok
from loadtest.replica import config as replica_config
from loadtest.replica.config import ReplicaConfig, to_argv

__all__ = ["Fleet", "FleetError", "add_arguments", "main"]

_FLEET_OWNED = frozenset({"name", "port", "admin_port", "host"})


class FleetError(RuntimeError):
    """A replica did not come up (the message carries the tail of its log)."""


@dataclass
class _Member:
    name: str
    port: int
    admin_port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None


class Fleet:
    def __init__(self, replicas: int = 4, base_port: int | None = None, host: str = "127.0.0.1",
                 *, names: list[str] | None = None, startup_timeout: float = 30.0,
                 stop_timeout: float = 5.0, log_dir: str | None = None,
                 **replica_options: Any) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        owned = sorted(_FLEET_OWNED & set(replica_options))
        if owned:
            raise TypeError(f"the fleet sets {', '.join(owned)} itself")
        self._argv = to_argv(replica_options)   # validates option names before anything starts
        self.host = host
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._tmp = None if log_dir else tempfile.TemporaryDirectory(prefix="sim-fleet-")
        self.log_dir = Path(log_dir or self._tmp.name)  # type: ignore[union-attr]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        names = names or [f"sim-{i}" for i in range(replicas)]
        if len(names) != replicas:
            raise ValueError("names must have one entry per replica")
        self._members = [
            _Member(name=n, port=base_port + i if base_port is not None else free_port(host),
                    admin_port=free_port("127.0.0.1"), log=self.log_dir / f"{n}.log")
            for i, n in enumerate(names)]
        self._lock = threading.Lock()

    # -- addresses -------------------------------------------------------------------------------
    def _url_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def names(self) -> list[str]:
        return [m.name for m in self._members]

    @property
    def ports(self) -> list[int]:
        return [m.port for m in self._members]

    @property
    def urls(self) -> list[str]:
        return [f"http://{self._url_host()}:{m.port}" for m in self._members]

    @property
    def admin_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{m.admin_port}" for m in self._members]

    @property
    def pids(self) -> list[int | None]:
        return [m.proc.pid if m.proc is not None and m.proc.poll() is None else None
                for m in self._members]

    def __len__(self) -> int:
        return len(self._members)

    # -- lifecycle -------------------------------------------------------------------------------
    def _spawn(self, m: _Member) -> None:
        argv = [sys.executable, "-m", "loadtest", "replica", "--name", m.name, "--host", self.host,
                "--port", str(m.port), "--admin-port", str(m.admin_port), *self._argv]
        with open(m.log, "ab") as log:
            m.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                      start_new_session=True)

    def _wait_healthy(self, members: list[_Member]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        pending = list(members)
        while pending:
            for m in list(pending):
                assert m.proc is not None
                if m.proc.poll() is not None:
                    raise FleetError(f"{m.name} exited with {m.proc.returncode}:\n{self._tail(m)}")
                if self._healthy(m):
                    pending.remove(m)
            if pending and time.monotonic() > deadline:
                raise FleetError(f"{pending[0].name} not healthy after {self.startup_timeout}s:\n"
                                 f"{self._tail(pending[0])}")
            if pending:
                time.sleep(0.05)

    def _healthy(self, m: _Member) -> bool:
        return http_ok(f"http://{self._url_host()}:{m.port}/health")

    @staticmethod
    def _tail(m: _Member, lines: int = 20) -> str:
        try:
            return "\n".join(m.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self) -> Fleet:
        atexit.register(self.stop)  # no orphaned replicas if the owner forgets to stop us
        with self._lock:
            for m in self._members:
                self._spawn(m)
        try:
            self._wait_healthy(self._members)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        atexit.unregister(self.stop)
        with self._lock:
            live = [m for m in self._members if m.proc is not None and m.proc.poll() is None]
            for m in live:
                with contextlib.suppress(ProcessLookupError):
                    m.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
                    # a SIGSTOPped replica (chaos tests) handles the TERM only once continued
                    m.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            deadline = time.monotonic() + self.stop_timeout
            for m in live:
                assert m.proc is not None
                try:
                    m.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    m.proc.kill()
                    m.proc.wait(timeout=5)
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.cleanup()
            self._tmp = None

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to replica i; for SIGKILL/SIGTERM wait until it is gone."""
        m = self._members[i]
        if m.proc is None or m.proc.poll() is not None:
            return
        m.proc.send_signal(sig)
        if sig == signal.SIGTERM:
            m.proc.send_signal(signal.SIGCONT)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            try:
                m.proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait(timeout=5)

    def restart(self, i: int) -> None:
        """Stop replica i if it runs, start it again on the same ports, wait until healthy."""
        self.kill(i, signal.SIGTERM)
        m = self._members[i]
        self._spawn(m)
        self._wait_healthy([m])

    def alive(self, i: int) -> bool:
        proc = self._members[i].proc
        return proc is not None and proc.poll() is None

    def returncode(self, i: int) -> int | None:
        proc = self._members[i].proc
        return None if proc is None else proc.poll()

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- admin helpers (loopback admin port) -------------------------------------------------------
    def _admin(self, i: int, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.admin_urls[i] + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=5.0) as resp:
            return json.loads(resp.read() or b"null")

    def fault(self, i: int, **spec: Any) -> dict[str, Any]:
        """Replace replica i's fault spec (`loadtest.replica.faults.FaultSpec` fields)."""
        return dict(self._admin(i, "POST", "/admin/fault", spec))

    def clear_fault(self, i: int) -> None:
        self._admin(i, "DELETE", "/admin/fault")

    def stats(self, i: int) -> dict[str, Any]:
        return dict(self._admin(i, "GET", "/admin/stats"))


# -- `prefix-loadtest fleet` ---------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=4, help="number of replicas")
    parser.add_argument("--base-port", type=int, default=None,
                        help="replica i listens on base-port + i (default: free ports)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address of every replica")
    group = parser.add_argument_group("replica options (passed to every replica)")
    replica_config.add_arguments(group, skip=_FLEET_OWNED)  # type: ignore[arg-type]


def main(args: argparse.Namespace) -> int:
    defaults = {f.name: f.default for f in fields(ReplicaConfig)}
    options = {k: getattr(args, k) for k in defaults
               if k not in _FLEET_OWNED and getattr(args, k) != defaults[k]}
    fleet = Fleet(replicas=args.replicas, base_port=args.base_port, host=args.host, **options)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        fleet.start()
    except FleetError as exc:
        print(f"prefix-loadtest fleet: {exc}", file=sys.stderr)
        return 1
    for name, url, admin in zip(fleet.names, fleet.urls, fleet.admin_urls, strict=True):
        print(f"{name}\t{url}\tadmin {admin}", flush=True)
    reported: set[str] = set()
    try:
        while not stop.wait(0.5):
            for i, name in enumerate(fleet.names):
                if name not in reported and not fleet.alive(i):
                    reported.add(name)
                    print(f"{name} exited with {fleet.returncode(i)}", file=sys.stderr, flush=True)
    finally:
        fleet.stop()
    return 0
