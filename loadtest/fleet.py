"""A fleet of simulated replicas, one process each, managed by PID.

    with Fleet(replicas=4, speed=10) as fleet:     # replica options are ReplicaConfig fields
        fleet.urls      # ["http://127.0.0.1:41231", ...]
        fleet.names     # ["sim-0", ..., "sim-3"]
        fleet.kill(1)   # SIGKILL replica 1 (chaos); fleet.restart(1) brings it back, same port
        fleet.fault(2, error_rate=1.0, error_status=503)   # POST /admin/fault on its admin port

    # a mixed fleet: 3 replicas of llama (adapter sql on the first), 2 of qwen
    with Fleet.mixed(parse_models("llama:3,qwen:2"), parse_loras("llama:sql:1")) as fleet:
        fleet.names     # ["llama-0", "llama-1", "llama-2", "qwen-0", "qwen-1"]
        fleet.models    # [("llama", ("sql",)), ("llama", ()), ...]: base model, adapters

    # KV cache events (vLLM's --kv-events-config): replica i publishes on port 5557 + i and
    # answers replays on 6557 + i (a port of 0: ports the kernel hands out)
    with Fleet(replicas=2, kv_events_config='{"enable_kv_cache_events": true, "topic": "kv", '
               '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:6557"}') as fleet:
        fleet.kv_endpoints          # ["tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"]
        fleet.kv_replay_endpoints   # ["tcp://127.0.0.1:6557", "tcp://127.0.0.1:6558"]

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
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from types import TracebackType
from typing import Any

from loadtest._net import free_port, http_ok
from loadtest.replica import config as replica_config
from loadtest.replica.config import ReplicaConfig, to_argv
from loadtest.replica.kv_config import (
    KvEventsConfig,
    is_bind_endpoint,
    parse_kv_events_config,
    split_tcp,
    with_port,
)

__all__ = ["NAME_PREFIX", "Fleet", "FleetError", "add_arguments", "main", "parse_loras", "parse_models"]

NAME_PREFIX = "sim-"  # replica i of a fleet without explicit names is NAME_PREFIX + str(i)

_FLEET_OWNED = frozenset({"name", "port", "admin_port", "host"})
_PER_MEMBER = frozenset({"model", "lora"})  # set per replica by a mixed fleet


def parse_models(spec: str) -> list[tuple[str, int]]:
    """``llama:3,qwen:2`` -> [("llama", 3), ("qwen", 2)] (ValueError naming the bad item)."""
    out: list[tuple[str, int]] = []
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, count = item.rpartition(":")
        if not sep or not name or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--models: expected MODEL:REPLICAS (e.g. llama:3), got {item!r}")
        if any(n == name for n, _ in out):
            raise ValueError(f"--models: {name!r} given twice")
        out.append((name, int(count)))
    if not out:
        raise ValueError("--models: expected at least one MODEL:REPLICAS")
    return out


def parse_loras(spec: str) -> list[tuple[str, str, int | None]]:
    """``llama:sql,llama:support:1`` -> [("llama", "sql", None), ("llama", "support", 1)]:
    adapter ``sql`` on every llama replica, ``support`` on the first one only."""
    out: list[tuple[str, str, int | None]] = []
    for item in filter(None, (p.strip() for p in spec.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or not all(parts[:2]) or (
                len(parts) == 3 and not (parts[2].isdigit() and int(parts[2]) >= 1)):
            raise ValueError(f"--loras: expected MODEL:ADAPTER[:REPLICAS] (e.g. llama:sql), "
                             f"got {item!r}")
        out.append((parts[0], parts[1], int(parts[2]) if len(parts) == 3 else None))
    return out


def mixed_members(models: list[tuple[str, int]], loras: list[tuple[str, str, int | None]]
                  ) -> list[tuple[str, str, tuple[str, ...]]]:
    """(replica name, base model, adapters) of every replica of a mixed fleet, in order."""
    known = dict(models)
    for model, adapter, _ in loras:
        if model not in known:
            raise ValueError(f"--loras: adapter {adapter!r} names model {model!r}, "
                             f"which is not in --models")
    out = []
    for model, count in models:
        for i in range(count):
            adapters = tuple(a for m, a, n in loras if m == model and (n is None or i < n))
            out.append((f"{model}-{i}", model, adapters))
    return out


def _port_of(endpoint: str) -> int:
    parts = split_tcp(endpoint)
    if parts is None or not parts[1].isdigit():
        raise ValueError(f"--kv-events-config: a fleet needs tcp://HOST:PORT endpoints, "
                         f"got {endpoint!r}")
    return int(parts[1])


class FleetError(RuntimeError):
    """A replica did not come up (the message carries the tail of its log)."""


@dataclass
class _Member:
    name: str
    port: int
    admin_port: int
    log: Path
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    kv_port: int | None = None          # the KV-event PUB port it binds (None: not publishing)
    kv_replay_port: int | None = None
    log_from: int = 0                   # the log's size when the process was last spawned


class Fleet:
    def __init__(self, replicas: int = 4, base_port: int | None = None, host: str = "127.0.0.1",
                 *, names: list[str] | None = None, startup_timeout: float = 30.0,
                 stop_timeout: float = 5.0, log_dir: str | None = None,
                 per_replica: list[dict[str, Any]] | None = None,
                 **replica_options: Any) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        owned = sorted(_FLEET_OWNED & set(replica_options))
        if owned:
            raise TypeError(f"the fleet sets {', '.join(owned)} itself")
        kv_text = replica_options.pop("kv_events_config", None)
        kv = parse_kv_events_config(kv_text) if kv_text is not None else None
        self._argv = to_argv(replica_options)   # validates option names before anything starts
        per_replica = per_replica or [{} for _ in range(replicas)]
        if len(per_replica) != replicas:
            raise ValueError("per_replica must have one entry per replica")
        self._member_argv = [to_argv(o) for o in per_replica]
        self.models = [(str(o.get("model", replica_options.get("model", "sim-model"))),
                        tuple(o.get("lora", replica_options.get("lora", ()))))
                       for o in per_replica]
        self.host = host
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._own_ports = base_port is None   # picked here, so another pick is allowed
        self._tmp = None if log_dir else tempfile.TemporaryDirectory(prefix="sim-fleet-")
        self.log_dir = Path(log_dir or self._tmp.name)  # type: ignore[union-attr]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        names = names or [f"{NAME_PREFIX}{i}" for i in range(replicas)]
        if len(names) != replicas:
            raise ValueError("names must have one entry per replica")
        self._members = [
            _Member(name=n, port=base_port + i if base_port is not None else free_port(host),
                    admin_port=free_port("127.0.0.1"), log=self.log_dir / f"{n}.log",
                    argv=self._member_argv[i])
            for i, n in enumerate(names)]
        if kv is not None:
            self._give_kv_ports(kv)
        self._lock = threading.Lock()

    def _give_kv_ports(self, kv: KvEventsConfig) -> None:
        """Every replica its own KV-event ports: the config's port + i (vLLM offsets by the
        data-parallel rank the same way), or free ports for a port of 0. An endpoint the
        replicas connect to (a collector's) is passed on unchanged."""
        if not kv.publishes or not is_bind_endpoint(kv.endpoint):
            for m in self._members:
                m.argv = [*m.argv, *to_argv({"kv_events_config": kv.to_json()})]
            return
        n = len(self._members)
        pub = _port_of(kv.endpoint)
        replay = _port_of(kv.replay_endpoint) if kv.replay_endpoint is not None else None
        if pub and replay and abs(pub - replay) < n:
            raise ValueError(f"--kv-events-config: the ports {pub} + i and {replay} + i of "
                             f"{n} replicas overlap; put them at least {n} apart")
        for i, m in enumerate(self._members):
            m.kv_port = pub + i if pub else free_port(self.host)
            if replay is not None:
                m.kv_replay_port = replay + i if replay else free_port(self.host)
            own = with_port(kv, m.kv_port, m.kv_replay_port)
            m.argv = [*m.argv, *to_argv({"kv_events_config": own.to_json()})]

    @classmethod
    def mixed(cls, models: list[tuple[str, int]],
              loras: Sequence[tuple[str, str, int | None]] = (),
              **options: Any) -> Fleet:
        """A fleet serving several base models: ``models`` as `parse_models` returns, adapters
        as `parse_loras`; replicas are named ``MODEL-i``."""
        taken = sorted(_PER_MEMBER & set(options))
        if taken:
            raise TypeError(f"a mixed fleet sets {', '.join(taken)} per replica")
        members = mixed_members(models, list(loras))
        return cls(replicas=len(members), names=[n for n, _, _ in members],
                   per_replica=[{"model": m, "lora": a} for _, m, a in members], **options)

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

    def _kv_host(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "::1" if self.host == "::" else self.host
        return f"[{host}]" if ":" in host else host

    @property
    def kv_endpoints(self) -> list[str | None]:
        """Where to connect a SUB socket to replica i's KV events (None: it does not bind one)."""
        return [None if m.kv_port is None else f"tcp://{self._kv_host()}:{m.kv_port}"
                for m in self._members]

    @property
    def kv_replay_endpoints(self) -> list[str | None]:
        """Where to send replica i's replay requests (a DEALER socket; None: no replay)."""
        return [None if m.kv_replay_port is None else f"tcp://{self._kv_host()}:{m.kv_replay_port}"
                for m in self._members]

    @property
    def kv_replicas(self) -> list[tuple[str, ...]]:
        """(name, url, KV-event endpoint, replay endpoint) of each replica, "" for none: the
        replica rows a router that subscribes to KV events is launched with."""
        return [(n, u, e or "", r or "") for n, u, e, r in zip(
            self.names, self.urls, self.kv_endpoints, self.kv_replay_endpoints, strict=True)]

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
                "--port", str(m.port), "--admin-port", str(m.admin_port), *self._argv, *m.argv]
        with open(m.log, "ab") as log:
            m.log_from = log.tell()
            m.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                      start_new_session=True)

    def _wait_healthy(self, members: list[_Member], repick: bool = False) -> None:
        """Wait until every member answers /health. With `repick` (a first start on ports picked
        here), a member that exited because its port was taken in between - by another process
        on a machine running several suites - is started again on fresh ports, twice at most."""
        deadline = time.monotonic() + self.startup_timeout
        pending = list(members)
        repicks = 0
        while pending:
            for m in list(pending):
                assert m.proc is not None
                if m.proc.poll() is not None:
                    if repick and repicks < 2 * len(members) and self._port_taken(m):
                        repicks += 1
                        m.port, m.admin_port = free_port(self.host), free_port("127.0.0.1")
                        self._spawn(m)
                        continue
                    raise FleetError(f"{m.name} exited with {m.proc.returncode}:\n{self._tail(m)}")
                if self._healthy(m):
                    pending.remove(m)
            if pending and time.monotonic() > deadline:
                raise FleetError(f"{pending[0].name} not healthy after {self.startup_timeout}s:\n"
                                 f"{self._tail(pending[0])}")
            if pending:
                time.sleep(0.05)

    def _port_taken(self, m: _Member) -> bool:
        if not self._own_ports or m.kv_port is not None:  # KV ports are part of its argv
            return False
        try:
            with open(m.log, "rb") as log:
                log.seek(m.log_from)
                return b"Address already in use" in log.read()
        except OSError:
            return False

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
            self._wait_healthy(self._members, repick=True)
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
    parser.add_argument("--models", default=None, metavar="MODEL:N,...",
                        help="a mixed fleet: N replicas of each base model, named MODEL-i "
                             "(e.g. llama:3,qwen:2; replaces --replicas and --model)")
    parser.add_argument("--loras", default=None, metavar="MODEL:ADAPTER[:N],...",
                        help="LoRA adapters of a mixed fleet: on every replica of MODEL, or "
                             "on its first N (e.g. llama:sql,llama:support:1)")
    group = parser.add_argument_group("replica options (passed to every replica)")
    replica_config.add_arguments(group, skip=_FLEET_OWNED)  # type: ignore[arg-type]


def main(args: argparse.Namespace) -> int:
    defaults = {f.name: f.default for f in fields(ReplicaConfig)}
    options = {k: getattr(args, k) for k in defaults
               if k not in _FLEET_OWNED and getattr(args, k) not in (None, defaults[k])}
    try:
        if args.models:
            for key in _PER_MEMBER:
                options.pop(key, None)
            fleet = Fleet.mixed(parse_models(args.models), parse_loras(args.loras or ""),
                                base_port=args.base_port, host=args.host, **options)
        elif args.loras:
            raise ValueError("--loras needs --models (or pass --lora NAME to every replica)")
        else:
            fleet = Fleet(replicas=args.replicas, base_port=args.base_port, host=args.host,
                          **options)
    except ValueError as exc:
        print(f"prefix-loadtest fleet: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        fleet.start()
    except FleetError as exc:
        print(f"prefix-loadtest fleet: {exc}", file=sys.stderr)
        return 1
    for name, url, admin, (model, adapters), kv, replay in zip(
            fleet.names, fleet.urls, fleet.admin_urls, fleet.models, fleet.kv_endpoints,
            fleet.kv_replay_endpoints, strict=True):
        served = f"\tmodels {','.join((model, *adapters))}" if args.models else ""
        events = (f"\tkv-events {kv}" if kv else "") + (f"\treplay {replay}" if replay else "")
        print(f"{name}\t{url}\tadmin {admin}{served}{events}", flush=True)
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
