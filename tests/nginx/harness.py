"""Test harness: a real nginx on 127.0.0.1 plus tiny upstreams that say who they are.

Each :class:`NginxProcess` has its own prefix directory (config, pid, logs, temp files), runs with
``daemon off`` as a child of the test process and is stopped by its PID. Upstreams are starlette
apps on real uvicorn servers; each answers with its replica name in ``x-replica-name``, like the
simulated replica in ``loadtest/replica``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from loadtest._net import quiet_port
from router.nginx_config import NginxOptions, render, render_config
from router.replicas import address_of
from router.ring import RingMember
from router.ring.nginx import NginxRing
from router.settings import Settings
from tests.conftest import ThreadedServer, require_binary, wait_for_port

Replica = tuple[str, str, int]  # (name, url, weight), what render_config takes
KEY_HEADER = "X-Prefix-Hash"
COMPLETION_BODY = b'{"model": "m", "prompt": "hi"}'


def ring_of(replicas: Sequence[Replica]) -> NginxRing:
    """The router's model of nginx's ring over `replicas`: where each key should land."""
    return NginxRing([RingMember(name, weight, address_of(url)) for name, url, weight in replicas])


def nginx_binary() -> str:
    return require_binary("nginx")


@functools.cache
def _version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10, check=False)
    match = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", out.stderr + out.stdout)
    return tuple(int(x) for x in match.groups()) if match else (0, 0, 0)


def _command(prefix: Path, conf: Path, *extra: str) -> list[str]:
    binary = nginx_binary()
    return [binary, *extra, "-p", str(prefix), "-c", str(conf),
            # -e (1.19.5+) keeps even start-up errors in the prefix; older builds use their
            # compiled-in error log until the config's error_log takes over
            *(["-e", str(prefix / "error.log")] if _version(binary) >= (1, 19, 5) else []),
            "-g", _globals()]


def _globals() -> str:
    # As root the master would hand workers to `nobody`, who cannot use the 0700 pytest tmp dirs.
    return "daemon off;" + (" user root;" if os.geteuid() == 0 else "")


def check_config(prefix: Path, conf_text: str,
                 name: str = "nginx.conf") -> subprocess.CompletedProcess[str]:
    """``nginx -t`` on ``conf_text`` written into ``prefix``."""
    prefix.mkdir(parents=True, exist_ok=True)
    conf = prefix / name
    conf.write_text(conf_text)
    return subprocess.run(
        _command(prefix, conf, "-t"), capture_output=True, text=True, timeout=30, check=False,
    )


class NginxProcess:
    """One nginx master (daemon off) serving ``conf_text`` on 127.0.0.1:``port``."""

    def __init__(self, prefix: Path, conf_text: str, port: int) -> None:
        self.prefix, self.port = prefix, port
        self.conf = prefix / "nginx.conf"
        self.proc: subprocess.Popen[bytes] | None = None
        prefix.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(conf_text)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> NginxProcess:
        self.proc = subprocess.Popen(
            _command(self.prefix, self.conf), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            wait_for_port(self.port, timeout=15)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"nginx did not start: {self.error_log()}") from None
        return self

    def reload(self, conf_text: str) -> None:
        """Swap the config with SIGHUP and wait until only new-generation workers remain."""
        assert self.proc is not None
        old = self.workers()
        self.conf.write_text(conf_text)
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            current = self.workers()
            if current and not current & old:
                return
            time.sleep(0.02)
        raise RuntimeError(f"nginx reload did not finish: {self.error_log()}")

    def workers(self) -> set[int]:
        """PIDs of the master's worker processes (children in /proc)."""
        assert self.proc is not None
        found: set[int] = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                # pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                    found.add(int(entry.name))
        return found

    def error_log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text()[-2000:] if path.exists() else "<no error.log>"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # SIGTERM: fast shutdown of master and workers
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)


@contextlib.contextmanager
def running_nginx(prefix: Path, replicas: Sequence[Replica],
                  **options: object) -> Iterator[NginxProcess]:
    """A standalone nginx rendered from ``replicas``; options go to :class:`NginxOptions`."""
    port = quiet_port()
    conf = render_standalone(replicas, port, **options)
    nginx = NginxProcess(prefix, conf, port).start()
    try:
        yield nginx
    finally:
        nginx.stop()


def render_standalone(replicas: Sequence[Replica], port: int, **options: object) -> str:
    opts = NginxOptions(listen=f"127.0.0.1:{port}", standalone=True, worker_processes="1",
                        worker_connections=256, **options)  # type: ignore[arg-type]
    return render_config(replicas, opts)


class StreamGate:
    """Lets a test hold an SSE upstream between its first chunk and the rest."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.finished = threading.Event()


def identity_app(name: str, gate: StreamGate | None = None) -> Starlette:
    """An upstream that names itself; ``POST /v1/stream`` streams SSE held by ``gate``."""

    async def whoami(request: Request) -> Response:
        await request.body()
        return JSONResponse({"replica": name, "path": request.url.path,
                             "key": request.headers.get(KEY_HEADER.lower())},
                            headers={"x-replica-name": name})

    async def stream(request: Request) -> Response:
        await request.body()

        async def events() -> AsyncIterator[bytes]:
            yield b'data: {"chunk": 0}\n\n'
            if gate is not None:
                # Bounded: a hung test still ends; the marker then fails its assertion.
                for _ in range(500):
                    if gate.release.is_set():
                        break
                    await asyncio.sleep(0.02)
                else:
                    yield b"data: gate-timeout\n\n"
            for i in range(1, 4):
                yield f'data: {{"chunk": {i}}}\n\n'.encode()
            yield b"data: [DONE]\n\n"
            if gate is not None:
                gate.finished.set()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"x-replica-name": name})

    return Starlette(routes=[
        Route("/v1/stream", stream, methods=["POST"]),
        Route("/v1/{rest:path}", whoami, methods=["GET", "POST"]),
        Route("/{rest:path}", whoami, methods=["GET", "POST"]),
    ])


@contextlib.contextmanager
def identity_fleet(weights: Sequence[int]) -> Iterator[list[Replica]]:
    """Replicas r0..rN-1 (with the given weights) on real uvicorn servers."""
    servers = [ThreadedServer(identity_app(f"r{i}")) for i in range(len(weights))]
    try:
        for server in servers:
            server.start()
        yield [(f"r{i}", s.url, w) for i, (s, w) in enumerate(zip(servers, weights, strict=True))]
    finally:
        for server in servers:
            server.stop()


def _backend_conf(names_ports: Sequence[tuple[str, int]]) -> str:
    servers = "".join(
        f"    server {{ listen 127.0.0.1:{port}; location / {{\n"
        f"        add_header x-replica-name {name} always; return 200 '{name}\\n'; }} }}\n"
        for name, port in names_ports)
    return ("worker_processes 1;\npid nginx.pid;\nevents { worker_connections 256; }\n"
            "http {\n    access_log off;\n    client_body_temp_path client_body_temp;\n"
            f"{servers}}}\n")


@contextlib.contextmanager
def nginx_fleet(prefix: Path, weights: Sequence[int]) -> Iterator[list[Replica]]:
    """Like :func:`identity_fleet` but every replica is a ``server`` of one backend nginx:
    the same self-naming upstreams at a fraction of the cost, for bulk placement captures."""
    names_ports = [(f"r{i}", quiet_port()) for i in range(len(weights))]
    backend = NginxProcess(prefix, _backend_conf(names_ports), names_ports[-1][1])
    backend.start()
    try:
        for _, port in names_ports:
            wait_for_port(port)
        yield [(name, f"http://127.0.0.1:{port}", w)
               for (name, port), w in zip(names_ports, weights, strict=True)]
    finally:
        backend.stop()


def ring_parity_setup(prefix: Path, replicas: Sequence[Replica],
                      models: dict[str, list[str]] | None = None) -> tuple[Settings, NginxProcess]:
    """Router settings with ``routing.ring: nginx`` over ``replicas`` (and their ``models``),
    and a started nginx rendered from them: the two sides of a parity test."""
    settings = Settings.from_dict({
        "replicas": [{"name": n, "url": u, "weight": w,
                      **({"models": models[n]} if models else {})} for n, u, w in replicas],
        "routing": {"ring": "nginx"},
        "scrape": {"enabled": False},
        "health": {"interval": 60.0},
    })
    port = quiet_port()
    conf = render(settings, listen=f"127.0.0.1:{port}", standalone=True)
    return settings, NginxProcess(prefix, conf, port).start()


def placements(port: int, keys: Iterable[str]) -> dict[str, str]:
    """Which replica the proxy on 127.0.0.1:``port`` (nginx or the router) sends each key to,
    read from the upstream's own ``x-replica-name``.

    A key is sent as its UTF-8 bytes and recorded as an ASGI server would hand it to the router
    (those bytes decoded as latin-1); for ASCII keys both are the key itself. Plain http.client
    on one keep-alive connection: a third of httpx's per-request cost here.
    """
    out: dict[str, str] = {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for key in keys:
            raw = key.encode()
            conn.request("POST", "/v1/completions", body=COMPLETION_BODY,
                         headers={KEY_HEADER: raw, "Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise AssertionError(f"key {key!r}: HTTP {response.status}")
            out[raw.decode("latin-1")] = response.headers["x-replica-name"]
    finally:
        conn.close()
    return out
