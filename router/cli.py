"""`prefix-router` command line: serve, check-config, nginx-config, hash-key.

    prefix-router serve --config router.yaml
    prefix-router serve --backend http://10.0.0.1:8000 --backend http://10.0.0.2:8000 --port 8080
    prefix-router serve                      # quick start: a simulated fleet of 4 (loadtest.demo)
    prefix-router check-config --config router.yaml
    prefix-router nginx-config --config router.yaml [--out FILE] [--listen ADDR] [--standalone]
    prefix-router nginx-config --backend a=http://10.0.0.1:8000 --backend http://10.0.0.2:8000=2
    prefix-router hash-key [--path /v1/chat/completions] [--config router.yaml] < body.json
    prefix-router epp --config router.yaml [--port 9002] [--admin-port 9090]   # router.epp

`serve` with neither --config nor --backend runs the quick-start demo when `main` is given one
(``demo=``): the `prefix-router` console script is `loadtest.demo.router_main`, which passes the
simulated fleet, so this package never imports the load-test kit (the import contracts in
pyproject.toml forbid it). `python -m router serve` without replicas exits 2 saying so.

Configuration problems exit with status 2 and one line on stderr naming the key and value.
Flags override the file (each validated like its YAML key). With `--workers N > 1` uvicorn
spawns N processes that import `router.app:app_factory` and read the settings from the JSON file
named by `SETTINGS_ENV` (in a private temporary directory); metrics are merged across them through prometheus_client's multiprocess mode
(a private temporary directory, removed on exit). The workers also share their routing state
with each other by default (`Settings.workers_share`): the parent makes a ``peers`` directory
there and names it in `PEER_DIR_ENV`; each worker claims a slot in it and binds an ``ipc://``
peer socket there, subscribing to its siblings' (`router.peers.service`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

from router.settings import (
    EPP_ADMIN_PORT,
    EPP_BODY_MODES,
    PEER_DIR_ENV,
    POLICIES,
    SETTINGS_ENV,
    Settings,
    SettingsError,
    kv_installed,
    load_settings,
    write_settings_file,
)

__all__ = [
    "Demo", "DemoFactory", "add_listen_flags", "add_replica_flags", "build_parser", "main", "serve"
]

PROG = "prefix-router"


class Demo(Protocol):
    """Stand-in replicas for `serve` without any (``loadtest.demo`` provides a simulated fleet)."""

    names: Sequence[str]
    urls: Sequence[str]

    def banner(self, settings: Settings) -> str:
        """What to print once the router's settings are known (how to try it)."""
        ...


DemoFactory = Callable[[], contextlib.AbstractContextManager[Demo]]


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(code)


def _settings(config: str | None) -> Settings:
    try:
        return load_settings(config) if config else Settings()
    except SettingsError as exc:
        _fail(str(exc))


def add_replica_flags(parser: argparse.ArgumentParser) -> None:
    """Where the replicas come from: ``serve`` and ``nginx-config`` take the same two flags."""
    parser.add_argument("--config", help="router.yaml (see docs/router.md)")
    parser.add_argument("--backend", action="append", default=[], metavar="[NAME=]URL[=WEIGHT]",
                        help="a replica (repeatable): base URL, optionally named and weighted, "
                             "e.g. http://10.0.0.1:8000, a=http://10.0.0.1:8000, "
                             "http://10.0.0.1:8000=2; replaces replicas from --config")


def add_listen_flags(parser: argparse.ArgumentParser) -> None:
    """How the router serves (``serve``, and ``prefix-loadtest demo``)."""
    parser.add_argument("--host", help="listen address (listen.host)")
    parser.add_argument("--port", type=int, help="listen port (listen.port)")
    parser.add_argument("--workers", type=int, help="uvicorn worker processes (workers)")
    parser.add_argument("--policy", choices=POLICIES, help="routing.policy")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Prefix-cache-aware router for vLLM")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the router")
    add_replica_flags(serve)
    add_listen_flags(serve)

    check = sub.add_parser("check-config", help="validate a router.yaml and exit")
    check.add_argument("--config", required=True)

    nginx = sub.add_parser("nginx-config", help="render an nginx config for the replicas")
    add_replica_flags(nginx)
    nginx.add_argument("--out", help="write here instead of stdout")
    nginx.add_argument("--listen", default="8080",
                       help="nginx listen address for the server block (default 8080)")
    nginx.add_argument("--standalone", action="store_true",
                       help="a complete nginx.conf (events/http blocks) instead of a conf.d snippet")

    epp = sub.add_parser("epp", help="run the endpoint picker of the Gateway API Inference "
                                     "Extension (Envoy ext_proc over gRPC; the epp extra)")
    add_replica_flags(epp)
    epp.add_argument("--host", help="gRPC listen address (epp.host, else listen.host)")
    epp.add_argument("--port", type=int, help="gRPC port: ext_proc and grpc.health.v1 "
                                              "(epp.port, default 9002)")
    epp.add_argument("--admin-host", help="admin listener address (admin.host)")
    epp.add_argument("--admin-port", type=int,
                     help=f"admin listener port: /metrics, /health, /ready (admin.port, "
                          f"default {EPP_ADMIN_PORT} for epp)")
    epp.add_argument("--policy", choices=POLICIES, help="routing.policy")
    epp.add_argument("--body-mode", choices=EPP_BODY_MODES,
                     help="the gateway's request body mode when its messages do not say "
                          "(epp.body_mode)")

    hk = sub.add_parser("hash-key", help="print the X-Prefix-Hash of a request body on stdin")
    hk.add_argument("--path", default="/v1/chat/completions")
    hk.add_argument("--config", help="use routing.* key settings from this router.yaml")
    return parser


def main(argv: Sequence[str] | None = None, *, demo: DemoFactory | None = None) -> int:
    """Run one subcommand; ``demo`` supplies replicas to `serve` when none are configured."""
    args = build_parser().parse_args(argv)
    command: str = args.command
    if command == "serve":
        return serve(args, demo)
    if command == "check-config":
        settings = _settings(args.config)
        try:
            settings.check_runnable()
        except SettingsError as exc:
            _fail(str(exc))
        print(f"{args.config}: ok ({len(settings.replicas)} static replicas, "
              f"policy {settings.routing.policy}, discovery {settings.discovery.type})")
        return 0
    if command == "nginx-config":
        return nginx_config(args)
    if command == "epp":
        return epp_command(args)
    return hash_key_command(args)


# serve ---------------------------------------------------------------------------------------

def serve(args: argparse.Namespace, demo: DemoFactory | None = None) -> int:
    settings = _settings(args.config)
    quick_start = not args.config and not args.backend
    if quick_start and demo is None:
        _fail("serve: no replicas; pass --config or --backend (the quick-start demo with "
              "simulated replicas is `prefix-router serve` or `prefix-loadtest demo`)")
    with contextlib.ExitStack() as stack:
        backends: list[str] = list(args.backend)
        names: list[str] | None = None
        fleet: Demo | None = None
        if quick_start and demo is not None:
            fleet = stack.enter_context(demo())
            backends, names = list(fleet.urls), list(fleet.names)
        try:
            settings = settings.with_overrides(host=args.host, port=args.port,
                                               workers=args.workers, policy=args.policy,
                                               backends=backends, names=names)
            settings.check_runnable()
        except SettingsError as exc:
            _fail(str(exc))
        if fleet is not None:
            print(fleet.banner(settings), flush=True)
        run_uvicorn(settings)
    return 0


def log_config(settings: Settings) -> dict[str, Any]:
    """uvicorn's log config plus the router's loggers (applied in every worker process)."""
    from uvicorn.config import LOGGING_CONFIG

    cfg: dict[str, Any] = json.loads(json.dumps(LOGGING_CONFIG))
    level = settings.logging.level.upper()
    cfg["loggers"]["prefix_router"] = {"handlers": ["default"], "level": level,
                                       "propagate": False}
    cfg["loggers"]["uvicorn.error"]["level"] = level
    return cfg


def _graceful_exit(signum: int, frame: object) -> None:
    raise SystemExit(0)


def run_uvicorn(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM. uvicorn drains in-flight requests for `shutdown.grace_period`,
    runs the lifespan shutdown, then re-raises the signal it captured; the handler installed here
    turns that SIGTERM into SystemExit so callers' cleanup (demo fleet, metrics dir) still runs.
    HTTP is uvicorn's httptools protocol with the router's connection limits
    (`router.limits.HTTP_PROTOCOL`); the open-file limit is raised to what they need first."""
    import uvicorn

    from router.limits import HTTP_PROTOCOL, ensure_descriptors

    signal.signal(signal.SIGTERM, _graceful_exit)
    warning = ensure_descriptors(settings)
    if warning:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    common: dict[str, Any] = dict(
        host=settings.listen.host, port=settings.listen.port, loop="uvloop", http=HTTP_PROTOCOL,
        timeout_keep_alive=settings.limits.keepalive_timeout,
        lifespan="on", interface="asgi3", log_config=log_config(settings),
        log_level=settings.logging.level,
        access_log=False, server_header=False, date_header=False, proxy_headers=False,
        timeout_graceful_shutdown=settings.shutdown.grace_period)
    if settings.workers == 1:
        from router.app import create_app

        uvicorn.run(create_app(settings), **common)
        return
    tmp = tempfile.mkdtemp(prefix="prefix-router-")  # mode 0700
    prom_dir = os.path.join(tmp, "metrics")
    os.mkdir(prom_dir)
    settings_file = os.path.join(tmp, "settings.json")
    write_settings_file(settings, settings_file)
    os.environ[SETTINGS_ENV] = settings_file
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = prom_dir
    if settings.workers_share:
        if kv_installed():  # the workers find each other's sockets in here
            peer_dir = os.path.join(tmp, "peers")
            os.mkdir(peer_dir)
            os.environ[PEER_DIR_ENV] = peer_dir
        else:
            print(f"{PROG}: warning: the {settings.workers} workers share no routing state "
                  "(sibling peers need the kv extra: pip install 'prefix-router[kv]'); each "
                  "keeps its own prefix index", file=sys.stderr)
    try:
        uvicorn.run("router.app:app_factory", factory=True, workers=settings.workers, **common)
    finally:
        os.environ.pop(PEER_DIR_ENV, None)
        shutil.rmtree(tmp, ignore_errors=True)


# epp -----------------------------------------------------------------------------------------

def epp_command(args: argparse.Namespace) -> int:
    """The endpoint picker: the replicas and routing of `serve` given the same --config /
    --backend, answered over ext_proc instead of proxied (`router.epp.server`)."""
    if not args.config and not args.backend:
        _fail("epp: no replicas; pass --config or --backend (or discovery in --config)")
    settings = _settings(args.config)
    try:
        settings = settings.with_overrides(policy=args.policy, backends=args.backend)
        admin_port = args.admin_port
        if admin_port is None and not settings.admin.enabled:
            admin_port = EPP_ADMIN_PORT
        settings = settings.with_epp_overrides(host=args.host, port=args.port,
                                               admin_host=args.admin_host,
                                               admin_port=admin_port, body_mode=args.body_mode)
        settings.check_runnable()
        if not _epp_installed():
            raise SettingsError("epp: needs the epp extra (pip install 'prefix-router[epp]')")
    except SettingsError as exc:
        _fail(str(exc))
    from router.epp.server import run

    run(settings)
    return 0


def _epp_installed() -> bool:
    import importlib.util

    try:
        return all(importlib.util.find_spec(m) is not None for m in (
            "grpc", "grpc_health.v1", "envoy.service.ext_proc.v3"))
    except ImportError:
        return False


# nginx-config / hash-key ---------------------------------------------------------------------

def nginx_config(args: argparse.Namespace) -> int:
    """The replicas `serve` would route to given the same --config/--backend, as nginx config."""
    if not args.config and not args.backend:
        _fail("nginx-config: no replicas; pass --config or --backend")
    settings = _settings(args.config)
    from router.nginx_config import render

    try:
        settings = settings.with_overrides(backends=args.backend)
        text: str = render(settings, listen=args.listen, standalone=args.standalone)
    except (SettingsError, ValueError) as exc:
        _fail(str(exc))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def hash_key_command(args: argparse.Namespace) -> int:
    from router.client import hash_key
    from router.keys import key_config

    raw = sys.stdin.buffer.read()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        _fail(f"hash-key: stdin is not valid JSON ({exc})")
    if not isinstance(body, dict):
        _fail(f"hash-key: expected a JSON object on stdin, got {type(body).__name__}")
    key = hash_key(body, args.path, key_config(_settings(args.config).routing))
    if key is None:
        print("hash-key: no prefix key (cacheable prefix shorter than min_prefix_chars); "
              "the router routes this body by conversation", file=sys.stderr)
        return 1
    print(key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
