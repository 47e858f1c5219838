"""How to start each routing setup in front of a fleet, as a child process managed by PID.

A `Setup` names one way to route (``router-prefix``, ``nginx``, ``sglang-cache_aware``, ...);
`launch(setup, replicas, workdir)` starts it on a free 127.0.0.1 port, waits until it can route
(not merely until it listens) and returns a `Launched` handle whose ``stop()`` sends SIGTERM to
the PID it started, waits, then SIGKILLs. Every listener binds 127.0.0.1 only.

* ``router-<policy>``: ``python -m router serve --config router.yaml`` with static replicas,
  access log off, log level warning; ready when ``GET /ready`` is 200. Variants:
  ``router-<policy>+kv`` turns precise routing on (``routing.kv_events``, each replica's
  endpoints from the fleet: ``(name, url, events, replay)`` replicas, topic ``kv``);
  ``router-<policy>+peers`` turns ``routing.peers`` on; behind the splitter (``-x<N>+peers``)
  every process binds an ``ipc://`` socket in ``workdir`` and subscribes to the others';
  ``router-<policy>-w<N>`` is one process of N workers (``workers: N``; they share their
  routing state by default), ``+noshare`` sets ``routing.peers.siblings: false`` (they share
  nothing);
  ``router-<policy>+tracing`` turns `tracing` on, exporting to a `loadtest.otlp_sink` process
  the setup starts and stops with it (its CPU is not the router's);
  ``router-<policy>@<dir>`` runs the ``router`` package found in ``<dir>`` (another commit's
  source tree, e.g. ``git archive`` output) with this environment's dependencies, named
  ``router-<policy>@<basename of dir>``.
* ``nginx``: ``router.nginx_config.render(settings, listen=..., standalone=True)`` with
  ``routing.ring: nginx``; clients must send ``X-Prefix-Hash`` (``prefix_hash_header``); ready
  when the port answers.
* ``sglang-<policy>``: ``python -m sglang_router.launch_router``; it answers ``/health`` before
  its workers are registered, so ready = ``GET /workers`` lists every replica. Its tokenizer
  comes from the ``model_path`` each worker's ``/server_info`` reports (start the fleet with
  ``--model-path`` = `tiny_tokenizer_dir`).
* ``smg-<policy>``: ``smg launch`` (smg, the SGLang model gateway's successor); same readiness
  rule.
* ``vllm-<policy>``: the ``vllm-router`` binary; same readiness rule. ``vllm-kv_aware`` is fed
  by the fleet's KV events: ``--kv-event-source URL=ENDPOINT`` (and ``--kv-event-replay-source``)
  per replica, so the fleet must publish them (``(name, url, events, replay)`` replicas).
* ``+pd`` (``router-cache_aware+pd``, ``vllm-cache_aware+pd``): prefill/decode disaggregation
  over the fleet's two halves (`pd_halves`: the first half prefill, the rest decode; the fleet's
  replicas must run with ``kv_transfer_config``): ``replicas[].role`` for the router,
  ``--vllm-pd-disaggregation --prefill URL ... --decode URL ...`` for vllm-router.
* ``direct``: no router, the first replica (overhead baseline).
* ``passthrough``: `loadtest.passthrough` in front of the first replica - uvicorn + aiohttp with
  no routing, the floor of the router's own stack; ready when ``GET /health`` passes through.
* ``<setup>-x<N>`` (``router-cache_aware-x2``, ``sglang-cache_aware-x2``): N independent
  processes of that router (each with its own state: index, tree, affinities), every one
  ready as above, behind `loadtest.splitter` - a round-robin TCP splitter that hands each
  connection to the next process, as a Kubernetes Service does with router pods. ``-x1`` is one
  process behind the splitter (what the hop itself costs).

Any router policy name is passed through to ``routing.policy``; the router rejects one it does
not know (the setup then fails to start, naming it).

The Rust routers log every request at INFO; they run with ``--log-level warn`` and
``RUST_LOG=warn`` and their output goes to a log file in ``workdir``. Process CPU time
(`cpu_seconds`) sums the on-CPU nanoseconds of the PID and its descendants (nginx workers) from
/proc/<pid>/task/<tid>/schedstat.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from loadtest._net import free_port, http_get, http_ok

__all__ = [
    "KEY_HEADER",
    "Launched",
    "Setup",
    "SetupError",
    "cpu_seconds",
    "free_port",
    "launch",
    "parse_setup",
    "pd_halves",
    "tiny_tokenizer_dir",
]

KEY_HEADER = "X-Prefix-Hash"
KINDS = ("router", "nginx", "sglang", "smg", "vllm", "direct", "passthrough")
# may run as several processes behind the splitter
SPLIT_KINDS = ("router", "sglang", "smg", "vllm")
# (name, url), or (name, url, KV-event endpoint, replay endpoint) for a fleet publishing events
Replica = tuple[str, ...]


class SetupError(RuntimeError):
    """A setup did not come up; the message carries the tail of its log."""


@dataclass(frozen=True)
class Setup:
    kind: str
    policy: str = ""
    processes: int | None = None  # N processes behind the splitter; None: one, no splitter
    tracing: bool = False  # router only: OpenTelemetry traces on, to an OTLP sink
    source: str | None = None  # router only: a directory holding the router package to run
    kv: bool = False  # router only: routing.kv_events on (precise routing from KV events)
    peers: bool = False  # router only: routing.peers on (in-flight state shared between -xN)
    workers: int | None = None  # router only: `serve --workers N` (one process, N workers)
    noshare: bool = False  # router only: routing.peers.siblings off (workers share nothing)
    pd: bool = False  # router, vllm: prefill/decode disaggregation over the fleet's two halves

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"setup kind: expected one of {KINDS}, got {self.kind!r}")
        if self.processes is not None:
            if self.kind not in SPLIT_KINDS:
                raise ValueError(f"setup {self.kind}: only {', '.join(SPLIT_KINDS)} run as "
                                 "several processes")
            if self.processes < 1:
                raise ValueError(f"setup processes: expected >= 1, got {self.processes}")
        if (self.tracing or self.source or self.kv or self.peers or self.workers is not None
                or self.noshare) and self.kind != "router":
            raise ValueError(f"setup {self.kind}: -w<N>, +tracing, +kv, +peers, +noshare and "
                             "@source are router variants")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"setup workers: expected >= 1, got {self.workers}")
        if self.pd and (self.kind not in ("router", "vllm") or self.processes is not None):
            raise ValueError(f"setup {self.kind}: +pd is a variant of one router or vllm-router "
                             "process")

    @property
    def name(self) -> str:
        name = f"{self.kind}-{self.policy}" if self.policy else self.kind
        if self.workers is not None:
            name += f"-w{self.workers}"
        if self.processes is not None:
            name += f"-x{self.processes}"
        if self.tracing:
            name += "+tracing"
        if self.kv:
            name += "+kv"
        if self.peers:
            name += "+peers"
        if self.noshare:
            name += "+noshare"
        if self.pd:
            name += "+pd"
        if self.source:
            name += "@" + Path(self.source).name
        return name

    @property
    def single(self) -> Setup:
        """One process of this setup, without the splitter."""
        return Setup(self.kind, self.policy, tracing=self.tracing, source=self.source, kv=self.kv,
                     peers=self.peers, workers=self.workers, noshare=self.noshare, pd=self.pd)

    @property
    def prefix_hash_header(self) -> str | None:
        return KEY_HEADER if self.kind == "nginx" else None

    def unavailable(self) -> str | None:
        """Why this setup cannot run here, or None."""
        if self.kind == "nginx" and _nginx_binary() is None:
            return "nginx is not installed"
        if self.kind == "sglang" and importlib.util.find_spec("sglang_router") is None:
            return "sglang-router is not installed (pip install 'prefix-router[compare]')"
        if self.kind == "smg" and _binary("smg") is None:
            return "smg is not installed (pip install 'prefix-router[compare]')"
        if self.kind == "vllm" and _binary("vllm-router") is None:
            return "vllm-router is not installed (pip install 'prefix-router[compare]')"
        return None


_PROCESSES = re.compile(r"-x(\d+)$")
_WORKERS = re.compile(r"-w(\d+)$")
VARIANTS = ("tracing", "kv", "peers", "noshare", "pd")


def parse_setup(text: str) -> Setup:
    """``router-prefix`` / ``nginx`` / ``sglang-cache_aware`` / ``vllm-consistent_hash``;
    a ``-x<N>`` suffix: N processes behind the splitter (``router-cache_aware-x2``), before it
    a router's ``-w<N>``: one process with N workers (``router-cache_aware-w2``); then the
    router variants ``+tracing``, ``+kv``, ``+peers``, ``+noshare`` (the workers share
    nothing) and ``@/path/to/tree`` (``router-prefix-x2+tracing@/tmp/t``)."""
    text, _, source = text.partition("@")
    text, *variants = text.split("+")
    if any(v not in VARIANTS for v in variants):
        raise ValueError(f"setup variant: expected one of +{', +'.join(VARIANTS)}, got "
                         f"{text}+{'+'.join(variants)}")
    processes = workers = None
    if m := _PROCESSES.search(text):
        processes, text = int(m.group(1)), text[: m.start()]
    if m := _WORKERS.search(text):
        workers, text = int(m.group(1)), text[: m.start()]
    kind, _, policy = text.partition("-")
    return Setup(kind, policy, processes, tracing="tracing" in variants, source=source or None,
                 kv="kv" in variants, peers="peers" in variants, workers=workers,
                 noshare="noshare" in variants, pd="pd" in variants)


def _binary(name: str) -> str | None:
    """A console script of this environment (its bin/ first: `make bench` runs the venv's
    python without activating it), else one on the PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which(name, path=path)


def _nginx_binary() -> str | None:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx")
                                     else None)


# -- process handle --------------------------------------------------------------------------------
class Launched:
    def __init__(self, setup: Setup, url: str, proc: subprocess.Popen[bytes] | None,
                 log: Path | None, *, pid: int | None = None,
                 parts: Sequence[Launched] = (),
                 helpers: Sequence[subprocess.Popen[bytes]] = ()) -> None:
        self.setup, self.url, self.proc, self.log = setup, url, proc, log
        self._pid = pid   # a process this setup did not start (direct: the replica itself)
        self.parts = list(parts)  # the router processes behind a splitter (proc)
        self.helpers = list(helpers)  # started with it, stopped after it, CPU not counted

    @property
    def urls(self) -> list[str]:
        """Each router process's own URL (its /metrics): the parts', else this one's."""
        return [p.url for p in self.parts] or [self.url]

    @property
    def pid(self) -> int | None:
        """The process whose CPU time the setup's cells measure."""
        return self.proc.pid if self.proc is not None else self._pid

    def tail(self, lines: int = 15) -> str:
        if self.log is None:
            return ""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 5.0) -> None:
        _terminate(self.proc, grace)
        for part in self.parts:
            part.stop(grace)
        for helper in self.helpers:  # last: a router flushes its spans to its sink on exit
            _terminate(helper, grace)

    def __enter__(self) -> Launched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _terminate(p: subprocess.Popen[bytes] | None, grace: float) -> None:
    if p is None or p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=5)


def cpu_seconds(pid: int) -> float:
    """On-CPU time of ``pid`` and all its live descendants, in seconds, to the nanosecond.

    Per thread, the first field of ``/proc/<pid>/task/<tid>/schedstat`` (the scheduler's
    ``sum_exec_runtime``, ns), summed over the live threads of every process in the tree; the
    tree comes from the parent field of ``/proc/<pid>/stat``. Not utime+stime from ``stat``: those
    count 10 ms clock ticks, so a short run on a busy machine could read zero. A thread that
    exits between two readings takes its time with it (the proxies measured here serve on
    long-lived threads and processes). A process that is gone reads 0.
    """
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # the command name may contain spaces and parentheses: fields start after the last ')'
        parents[int(entry)] = int(stat[stat.rindex(b")") + 2:].split()[1])
    total_ns, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total_ns += _threads_runtime_ns(p)
        stack.extend(c for c, pp in parents.items() if pp == p)
    return total_ns / 1e9


def _threads_runtime_ns(pid: int) -> int:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


# -- launching -------------------------------------------------------------------------------------
def _spawn(argv: Sequence[str], log: Path, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
                                start_new_session=True, env=env, cwd=cwd)


def _wait(launched: Launched, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        if launched.proc is not None and launched.proc.poll() is not None:
            raise SetupError(f"{launched.setup.name} exited with {launched.proc.returncode}:\n"
                             f"{launched.tail()}")
        if time.monotonic() > deadline:
            launched.stop()
            raise SetupError(f"{launched.setup.name} not ready after {timeout:g}s:\n"
                             f"{launched.tail()}")
        time.sleep(0.1)


def pd_halves(replicas: Sequence[Replica]) -> tuple[Sequence[Replica], Sequence[Replica]]:
    """A ``+pd`` setup's (prefill, decode) replicas: the first half of the fleet, the rest."""
    half = max(1, len(replicas) // 2)
    return replicas[:half], replicas[half:]


def _router_settings(replicas: Sequence[Replica], policy: str, ring: str, port: int,
                     pd: bool = False) -> dict[str, object]:
    entries = [{"name": r[0], "url": r[1]} for r in replicas]
    if pd:
        prefill, _ = pd_halves(replicas)
        for i, entry in enumerate(entries):
            entry["role"] = "prefill" if i < len(prefill) else "decode"
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "replicas": entries,
        "routing": {"policy": policy, "ring": ring},
        "logging": {"level": "warning", "access_log": False},
    }


# routing.peers of one process behind the splitter: (its bind endpoint, the others')
PeerLinks = tuple[str, tuple[str, ...]]


def _launch_router(setup: Setup, replicas: Sequence[Replica], workdir: Path, port: int,
                   log: Path, peers: PeerLinks | None = None) -> Launched:
    import yaml

    settings = _router_settings(replicas, setup.policy or "prefix", "xxhash", port, setup.pd)
    helpers = []
    if setup.tracing:
        sink = free_port()
        helpers.append(_spawn([sys.executable, "-m", "loadtest.otlp_sink", "--port", str(sink)],
                              log))
        settings["tracing"] = {"enabled": True,
                               "endpoint": f"http://127.0.0.1:{sink}/v1/traces"}
    if setup.kv:
        if any(len(r) < 4 or not r[2] for r in replicas):
            raise SetupError(f"{setup.name}: the fleet publishes no KV events (start it with "
                             "kv_events_config)")
        for entry, r in zip(settings["replicas"], replicas, strict=True):  # type: ignore[call-overload]
            entry["kv_events_endpoint"] = r[2]
            entry["kv_replay_endpoint"] = r[3]
        settings["routing"]["kv_events"] = {"enabled": True,  # type: ignore[index]
                                            "topic": "kv"}
    if setup.workers is not None:
        settings["workers"] = setup.workers
    if setup.noshare:
        settings["routing"]["peers"] = {"siblings": False}  # type: ignore[index]
    if setup.peers:
        bind, others = peers or (f"ipc://{workdir.resolve()}/peer.sock", ())
        settings["routing"]["peers"] = {"enabled": True, "bind": bind,  # type: ignore[index]
                                        "endpoints": list(others)}
    env, cwd = None, None
    if setup.source:  # its router package first on the path; cwd without one of ours
        env = {**os.environ, "PYTHONPATH": str(Path(setup.source).resolve())}
        cwd = workdir
    conf = workdir / f"{setup.name}.yaml"
    conf.write_text(yaml.safe_dump(settings))
    proc = _spawn([sys.executable, "-m", "router", "serve", "--config", str(conf)], log,
                  env=env, cwd=cwd)
    launched = Launched(setup, f"http://127.0.0.1:{port}", proc, log, helpers=helpers)
    try:
        _wait(launched, lambda: http_ok(f"{launched.url}/ready"), 30.0)
    finally:
        if proc.poll() is not None:
            launched.stop()
    return launched


def _launch_nginx(setup: Setup, replicas: Sequence[Replica], workdir: Path, port: int,
                  log: Path) -> Launched:
    from router.nginx_config import render
    from router.settings import Settings

    settings = Settings.from_dict(_router_settings(replicas, "prefix", "nginx", port))
    prefix = workdir / "nginx"
    prefix.mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(render(settings, listen=f"127.0.0.1:{port}", standalone=True))
    binary = _nginx_binary()
    assert binary is not None
    # as root the master would hand workers to `nobody`, who may not read a private temp dir
    globals_ = "daemon off;" + (" user root;" if os.geteuid() == 0 else "")
    proc = _spawn([binary, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log"),
                   "-g", globals_], log)
    launched = Launched(setup, f"http://127.0.0.1:{port}", proc, log)
    _wait(launched, lambda: http_get(f"{launched.url}/") is not None, 15.0)
    return launched


def _workers_ready(url: str, n: int) -> bool:
    got = http_get(f"{url}/workers")
    if got is None or got[0] != 200:
        return False
    try:
        workers = json.loads(got[1]).get("workers", [])
    except ValueError:
        return False
    return len(workers) >= n and all(w.get("is_healthy", True) for w in workers)


def _launch_rust(setup: Setup, replicas: Sequence[Replica], workdir: Path, port: int,
                 log: Path) -> Launched:
    if setup.kind == "sglang":
        argv = [sys.executable, "-m", "sglang_router.launch_router", "--log-level", "warn"]
    elif setup.kind == "smg":
        binary = _binary("smg")
        assert binary is not None
        argv = [binary, "launch", "--log-level", "warn"]
    else:
        binary = _binary("vllm-router")
        assert binary is not None
        argv = [binary, "--log-level", "warning"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
             "--prometheus-port", str(free_port()), "--policy", setup.policy or "cache_aware",
             "--worker-startup-check-interval", "1"]
    if setup.pd:
        prefill, decode = pd_halves(replicas)
        argv += ["--vllm-pd-disaggregation"]
        for r in prefill:
            argv += ["--prefill", r[1]]
        for r in decode:
            argv += ["--decode", r[1]]
    else:
        argv += ["--worker-urls", *[r[1] for r in replicas]]
    if setup.kind == "vllm" and setup.policy == "kv_aware":
        argv += _vllm_kv_sources(setup, replicas)
    env = {**os.environ, "RUST_LOG": "warn"}
    proc = _spawn(argv, log, env=env, cwd=workdir)
    launched = Launched(setup, f"http://127.0.0.1:{port}", proc, log)
    _wait(launched, lambda: _workers_ready(launched.url, len(replicas)), 60.0)
    return launched


def _vllm_kv_sources(setup: Setup, replicas: Sequence[Replica]) -> list[str]:
    """vllm-router ``kv_aware``: each replica's KV-event PUB endpoint (and its replay one), the
    fleet's block size."""
    if any(len(r) < 4 or not r[2] for r in replicas):
        raise SetupError(f"{setup.name}: the fleet publishes no KV events (start it with "
                         "kv_events_config)")
    out = []
    for r in replicas:
        out += ["--kv-event-source", f"{r[1]}={r[2]}"]
        if r[3]:
            out += ["--kv-event-replay-source", f"{r[1]}={r[3]}"]
    return out + ["--kv-event-block-size", "16", "--kv-event-model", "sim-model"]


def launch(setup: Setup, replicas: Sequence[Replica], workdir: Path,
           port: int | None = None, attempts: int = 3,
           peers: PeerLinks | None = None) -> Launched:
    """Start ``setup`` in front of ``replicas`` and return once it routes.

    A free port can be taken by another process between `free_port` and the bind (a shared
    machine); a start that fails with "Address already in use" is retried on a new port.
    """
    for attempt in range(attempts):
        try:
            return _launch_once(setup, replicas, workdir, port, peers)
        except SetupError as exc:
            if port is not None or attempt == attempts - 1 or "in use" not in str(exc):
                raise
    raise AssertionError("unreachable")


def _launch_once(setup: Setup, replicas: Sequence[Replica], workdir: Path,
                 port: int | None, peers: PeerLinks | None = None) -> Launched:
    reason = setup.unavailable()
    if reason:
        raise SetupError(f"{setup.name}: {reason}")
    workdir.mkdir(parents=True, exist_ok=True)
    if setup.processes is not None:
        return _launch_split(setup, replicas, workdir, port)
    if setup.kind == "direct":
        return Launched(setup, replicas[0][1], None, None)
    port = port or free_port()
    log = workdir / f"{setup.name}.log"
    if setup.kind == "router":
        return _launch_router(setup, replicas, workdir, port, log, peers)
    if setup.kind == "nginx":
        return _launch_nginx(setup, replicas, workdir, port, log)
    if setup.kind == "passthrough":
        return _launch_passthrough(setup, replicas, port, log)
    return _launch_rust(setup, replicas, workdir, port, log)


def _launch_passthrough(setup: Setup, replicas: Sequence[Replica], port: int,
                        log: Path) -> Launched:
    proc = _spawn([sys.executable, "-m", "loadtest.passthrough", "--upstream", replicas[0][1],
                   "--port", str(port)], log)
    launched = Launched(setup, f"http://127.0.0.1:{port}", proc, log)
    _wait(launched, lambda: http_ok(f"{launched.url}/health"), 30.0)
    return launched


def _launch_split(setup: Setup, replicas: Sequence[Replica], workdir: Path,
                  port: int | None) -> Launched:
    """``setup.processes`` independent processes of ``setup.single``, then the splitter."""
    assert setup.processes is not None
    parts: list[Launched] = []
    n = setup.processes
    links: list[PeerLinks | None] = [None] * n
    if setup.peers:  # ipc sockets: no port to race for; short paths (sun_path holds 107 bytes)
        sockets = workdir.resolve() / "peers"
        sockets.mkdir(parents=True, exist_ok=True)
        ends = [f"ipc://{sockets}/{i}.sock" for i in range(n)]
        links = [(ends[i], tuple(e for e in ends if e != ends[i])) for i in range(n)]
    try:
        with ThreadPoolExecutor(n) as pool:  # start them side by side
            futures = [pool.submit(launch, setup.single, replicas, workdir / f"{setup.name}-{i}",
                                   peers=links[i])
                       for i in range(n)]
            for f in futures:
                with contextlib.suppress(Exception):  # collect every started one first
                    parts.append(f.result())
            for f in futures:
                f.result()  # then raise the first failure (the parts are stopped below)
        port = port or free_port()
        log = workdir / f"{setup.name}-splitter.log"
        argv = [sys.executable, "-m", "loadtest.splitter", "--port", str(port)]
        for p in parts:
            argv += ["--upstream", p.url.removeprefix("http://")]
        launched = Launched(setup, f"http://127.0.0.1:{port}", _spawn(argv, log), log,
                            parts=parts)
        _wait(launched, lambda: "ready" in launched.tail(), 15.0)
    except BaseException:
        for p in parts:
            p.stop()
        raise
    return launched


def tiny_tokenizer_dir(path: Path) -> Path:
    """A HF tokenizer directory (tokenizer.json + tokenizer_config.json) for sglang-router.

    A word-level vocabulary of a few common words: sglang-router only needs a tokenizer it can
    load from each worker's ``model_path``; the replicas keep counting tokens their own way.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers

    path.mkdir(parents=True, exist_ok=True)
    vocab = {"[UNK]": 0}
    for w in "the of and to in is you that it for are as with be on not this but by".split():
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # type: ignore[assignment]
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 32768,
        "unk_token": "[UNK]"}))
    return path
