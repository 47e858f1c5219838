"""Start and stop N real vLLM (CPU) replicas on loopback, by PID, for tests and benchmarks.

Each replica is one ``vllm serve`` process from the virtualenv that ``scripts/vllm_env.sh``
builds, serving the tiny local model from ``scripts/make_tiny_model.py`` with dummy weights.
Every replica is started in a new session, so it leads its own process group; ``stop()``
signals exactly those groups (vLLM's engine core and worker are child processes) — TERM, a
grace period, then KILL — and returns once no live process is left in them. Replica ``i`` is pinned to core ``i % nproc`` (``VLLM_CPU_OMP_THREADS_BIND``), logs
to ``<log_dir>/<name>.log`` and listens on a port from the kernel.

Replicas start concurrently; start-up (mostly Python imports, three per replica: ~90-190 s on
two busy shared cores, see docs/vllm.md) ends when ``GET /v1/models`` answers. A replica that exits or misses the deadline fails ``start()`` with
the tail of its log in the message.

    with VllmFleet(n=2, model_dir=find_env().model_dir) as fleet:
        fleet.urls            # ["http://127.0.0.1:41231", ...]
        fleet.metrics(0)      # {"vllm:prefix_cache_hits_total": 64.0, ...} (labels summed)

With ``kv_events=True`` every replica publishes its KV cache events (``--kv-events-config``,
topic ``kv_topic``) on a PUB port and answers replays on a ROUTER port of its own, both from the
kernel and kept across restarts: ``fleet.kv_endpoints`` / ``fleet.kv_replay_endpoints``
(docs/kv-events.md). With ``nixl=True`` every replica gets a NIXL side-channel port of its own
(``VLLM_NIXL_SIDE_CHANNEL_PORT``, ``fleet.nixl_ports``), so several can run vLLM's
NixlConnector (``--kv-transfer-config`` in ``extra_args``) on one host.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from loadtest._net import quiet_port
from loadtest.stats import parse_prometheus

__all__ = ["VllmEnv", "VllmEnvMissing", "VllmFleet", "find_env", "make_lora_adapter",
           "parse_metrics", "reset_prefix_cache"]

CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "prefix-router"
ENV_VAR_VENV = "PREFIX_ROUTER_VLLM_ENV"
ENV_VAR_MODEL = "PREFIX_ROUTER_TINY_MODEL"


class VllmEnvMissing(RuntimeError):
    """The vLLM virtualenv or the tiny model is not there (run ``make vllm-env``)."""


@dataclass(frozen=True)
class VllmEnv:
    venv: Path
    model_dir: Path

    @property
    def vllm_bin(self) -> Path:
        return self.venv / "bin" / "vllm"


def make_lora_adapter(env: VllmEnv, out: str | os.PathLike[str], rank: int = 8) -> Path:
    """A random LoRA adapter for the env's tiny model in ``out`` (``scripts/make_tiny_lora.py``,
    run by the env's own Python, which has torch), for ``--lora-modules NAME=out``."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_tiny_lora.py"
    subprocess.run([str(env.venv / "bin" / "python"), str(script), "--model-dir",
                    str(env.model_dir), "--out", str(out), "--rank", str(rank)],
                   check=True, capture_output=True, timeout=300)
    return Path(out)


def find_env(venv: str | os.PathLike[str] | None = None,
             model_dir: str | os.PathLike[str] | None = None) -> VllmEnv:
    """Locate the env built by ``scripts/vllm_env.sh``; raise ``VllmEnvMissing`` saying what lacks."""
    env = VllmEnv(
        venv=Path(venv or os.environ.get(ENV_VAR_VENV) or CACHE_ROOT / "vllm-env"),
        model_dir=Path(model_dir or os.environ.get(ENV_VAR_MODEL) or CACHE_ROOT / "tiny-llama"),
    )
    missing = []
    if not (env.venv / ".prefix-router-vllm-env").is_file() or not env.vllm_bin.is_file():
        missing.append(f"vLLM virtualenv at {env.venv}")
    if not (env.model_dir / "config.json").is_file() or not (env.model_dir / "tokenizer.json").is_file():
        missing.append(f"tiny model at {env.model_dir}")
    if missing:
        raise VllmEnvMissing(" and ".join(missing) + " not found; build it with `make vllm-env` "
                             "(scripts/vllm_env.sh)")
    return env


def _group_members(pgid: int) -> list[tuple[int, int]]:
    """(pid, rss pages) of the live (not zombie) processes in process group ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            # fields[0] is stat's 3rd field (state), [2] the 5th (pgrp), [21] the 24th (rss)
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                out.append((int(entry.name), int(fields[21])))
    return out


def reset_prefix_cache(url: str, who: str) -> None:
    """``POST {url}/reset_prefix_cache`` (vLLM dev mode); a refusal raises RuntimeError naming ``who``."""
    req = urllib.request.Request(url + "/reset_prefix_cache", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{who}: reset_prefix_cache answered {exc.code}") from exc


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name: value summed over label sets}; ``_created`` dropped."""
    return {k: v for k, v in parse_prometheus(text).items() if not k.endswith("_created")}


class VllmFleet:
    """N ``vllm serve`` replicas of one model on 127.0.0.1; see the module docstring."""

    def __init__(
        self,
        n: int = 2,
        model_dir: str | os.PathLike[str] | None = None,
        block_size: int = 32,
        *,
        venv: str | os.PathLike[str] | None = None,
        served_model_name: str = "tiny-llama",
        kv_cache_memory: str = "64M",
        max_model_len: int = 4096,
        max_num_seqs: int = 16,
        dtype: str = "float32",
        log_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 300.0,
        stop_timeout: float = 20.0,
        extra_args: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
        kv_events: bool = False,
        kv_topic: str = "kv",
        nixl: bool = False,
    ) -> None:
        if block_size % 32:
            raise ValueError(f"block_size: vLLM's CPU backend needs a multiple of 32, got {block_size}")
        self.env = find_env(venv, model_dir)
        self.n = n
        self.block_size = block_size
        self.served_model_name = served_model_name
        self.kv_cache_memory = kv_cache_memory
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.dtype = dtype
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="vllm-fleet-"))
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.extra_args = list(extra_args)
        self.extra_env = dict(extra_env or {})
        self.names = [f"vllm{i}" for i in range(n)]
        self.ports: list[int] = []
        self.kv_events = kv_events
        self.kv_topic = kv_topic
        self.kv_ports: list[tuple[int, int]] = []   # (PUB, replay ROUTER) of each replica
        # NixlConnector: each replica's side channel (VLLM_NIXL_SIDE_CHANNEL_PORT), its own
        self.nixl = nixl
        self.nixl_ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.startup_seconds: float | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    @property
    def kv_endpoints(self) -> list[str]:
        """Where to connect a SUB socket to replica i's KV events (empty: events off)."""
        return [f"tcp://127.0.0.1:{pub}" for pub, _ in self.kv_ports]

    @property
    def kv_replay_endpoints(self) -> list[str]:
        """Where to send replica i's replay requests (a DEALER socket)."""
        return [f"tcp://127.0.0.1:{replay}" for _, replay in self.kv_ports]

    def kv_events_config(self, i: int) -> dict[str, object]:
        """The ``--kv-events-config`` of replica ``i`` (vLLM binds an endpoint with ``*``)."""
        pub, replay = self.kv_ports[i]
        return {"enable_kv_cache_events": True, "publisher": "zmq", "topic": self.kv_topic,
                "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}

    def log_path(self, i: int) -> Path:
        return self.log_dir / f"{self.names[i]}.log"

    def command(self, port: int) -> list[str]:
        return [
            str(self.env.vllm_bin), "serve", str(self.env.model_dir),
            "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", self.served_model_name,
            "--load-format", "dummy",
            "--enforce-eager",
            "--enable-prefix-caching",
            "--block-size", str(self.block_size),
            "--kv-cache-memory-bytes", self.kv_cache_memory,
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--enable-prompt-tokens-details",
            # vLLM downcasts to bf16 on CPU by default; without AVX512-BF16 that falls back to
            # slow kernels (4x slower prefill measured here), fp32 is the fast path.
            "--dtype", self.dtype,
            "--seed", "0",
            *self.extra_args,
        ]

    def environ(self, i: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
        env.update({
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_CPU_OMP_THREADS_BIND": str(i % (os.cpu_count() or 1)),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            # exposes POST /reset_prefix_cache, so a test or benchmark can start from cold
            "VLLM_SERVER_DEV_MODE": "1",
        })
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if self.nixl_ports:
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(self.nixl_ports[i])
        env.update(self.extra_env)
        return env

    def start(self) -> VllmFleet:
        if self.procs:
            raise RuntimeError("fleet already started")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            for i in range(self.n):
                # all bound up to a minute from now (vLLM's start-up): below the ephemeral
                # range, out of the way of the machine's outgoing connections
                self.ports.append(quiet_port())
                if self.kv_events:
                    self.kv_ports.append((quiet_port(), quiet_port()))
                if self.nixl:
                    self.nixl_ports.append(quiet_port())
                self.procs.append(self._spawn(i))
            for i in range(self.n):
                self._wait_ready(i, t0 + self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _spawn(self, i: int) -> subprocess.Popen[bytes]:
        with open(self.log_path(i), "ab") as log:
            kv = (["--kv-events-config", json.dumps(self.kv_events_config(i))]
                  if self.kv_events else [])
            return subprocess.Popen([*self.command(self.ports[i]), *kv], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.environ(i), start_new_session=True)

    def restart(self, i: int) -> float:
        """Stop replica ``i`` if it runs and start it again on the same port; seconds taken."""
        self.kill(i, signal.SIGTERM)
        t0 = time.monotonic()
        self.procs[i] = self._spawn(i)
        self._wait_ready(i, t0 + self.startup_timeout)
        return time.monotonic() - t0

    def _wait_ready(self, i: int, deadline: float) -> None:
        url = self.urls[i] + "/v1/models"
        while time.monotonic() < deadline:
            if self.procs[i].poll() is not None:
                raise RuntimeError(f"{self.names[i]} exited with {self.procs[i].returncode} "
                                   f"during start-up:\n{self.log_tail(i)}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200 and json.load(resp).get("data"):
                        return
            time.sleep(0.5)
        raise TimeoutError(f"{self.names[i]} not ready after {self.startup_timeout:.0f}s:\n"
                           f"{self.log_tail(i)}")

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Signal replica ``i``'s process group (API server, engine core, worker) and return
        once no live process is left in it; after ``stop_timeout`` the rest gets SIGKILL."""
        self._signal(i, sig)
        self._reap(i)

    def _signal(self, i: int, sig: int) -> None:
        if self.procs[i].poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.procs[i].pid, sig)

    def _reap(self, i: int) -> None:
        proc = self.procs[i]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.stop_timeout)
        deadline = time.monotonic() + self.stop_timeout
        while _group_members(proc.pid) and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.05)
        proc.wait(timeout=self.stop_timeout)

    def stop(self) -> None:
        """SIGTERM every replica at once (vLLM shuts down gracefully), then reap each group."""
        for i in range(len(self.procs)):
            self._signal(i, signal.SIGTERM)
        for i in range(len(self.procs)):
            self._reap(i)
        self.procs = []
        self.ports = []
        self.kv_ports = []

    def alive(self, i: int) -> bool:
        return bool(self.procs) and self.procs[i].poll() is None

    def __enter__(self) -> VllmFleet:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- observation -------------------------------------------------------------------------

    def metrics(self, i: int, timeout: float = 5.0) -> dict[str, float]:
        with urllib.request.urlopen(self.urls[i] + "/metrics", timeout=timeout) as resp:
            return parse_metrics(resp.read().decode())

    def prefix_cache(self, i: int) -> tuple[float, float]:
        """(queries, hits) in tokens, cumulative since start."""
        m = self.metrics(i)
        return m.get("vllm:prefix_cache_queries_total", 0.0), m.get("vllm:prefix_cache_hits_total", 0.0)

    def reset_prefix_cache(self, i: int) -> None:
        """Empty replica ``i``'s prefix cache (vLLM refuses while requests run: RuntimeError)."""
        reset_prefix_cache(self.urls[i], self.names[i])

    def rss_bytes(self, i: int) -> int:
        """Resident memory of replica ``i``'s whole process group (API server, engine, worker)."""
        page = os.sysconf("SC_PAGE_SIZE")
        return sum(rss * page for _, rss in _group_members(self.procs[i].pid))

    def log_tail(self, i: int, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path(i).read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"


def main(argv: list[str] | None = None) -> int:
    """``python -m loadtest.vllm_fleet -n 2``: start a fleet, print its URLs, run until Ctrl-C."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--model-dir")
    ap.add_argument("--venv")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--log-dir")
    args = ap.parse_args(argv)
    fleet = VllmFleet(args.n, args.model_dir, args.block_size, venv=args.venv, log_dir=args.log_dir)
    with fleet:
        print(json.dumps({"urls": fleet.urls, "names": fleet.names, "logs": str(fleet.log_dir),
                          "pids": [p.pid for p in fleet.procs],
                          "startup_seconds": round(fleet.startup_seconds or 0, 1)}), flush=True)
        stop_on = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_on)
        signal.sigwait(stop_on)
    return 0


if __name__ == "__main__":
    sys.exit(main())
