"""`prefix-router` command line: serve, check-config, nginx-config, hash-key.

    prefix-router serve --config router.yaml
    prefix-router serve --backend http://10.0.0.1:8000 --backend http://10.0.0.2:8000 --port 8080
    prefix-router serve                      # quick-start: embedded simulated fleet of 4
    prefix-router check-config --config router.yaml
    prefix-router nginx-config --config router.yaml [--out FILE] [--listen ADDR] [--standalone]
    prefix-router hash-key [--path /v1/chat/completions] [--config router.yaml] < body.json

Configuration problems exit with status 2 and one line on stderr naming the key and value.
Flags override the file (each validated like its YAML key). With `--workers N > 1` uvicorn
spawns N processes that import `router.app:app_factory` and read the settings from the JSON file
named by `SETTINGS_ENV` (in a private temporary directory); metrics are merged across them through prometheus_client's multiprocess mode
(a private temporary directory, removed on exit).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from router.settings import (
    POLICIES,
    SETTINGS_ENV,
    Settings,
    SettingsError,
    load_settings,
    write_settings_file,
)

PROG = "prefix-router"
DEMO_REPLICAS = 4


def _fail(message: str, code: int = 2) -> NoReturn:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(code)


def _settings(config: str | None) -> Settings:
    try:
        return load_settings(config) if config else Settings()
    except SettingsError as exc:
        _fail(str(exc))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Prefix-cache-aware router for vLLM")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the router")
    serve.add_argument("--config", help="router.yaml (see docs/router.md)")
    serve.add_argument("--backend", action="append", default=[], metavar="URL",
                       help="replica base URL (repeatable); replaces replicas from --config")
    serve.add_argument("--host", help="listen address (listen.host)")
    serve.add_argument("--port", type=int, help="listen port (listen.port)")
    serve.add_argument("--workers", type=int, help="uvicorn worker processes (workers)")
    serve.add_argument("--policy", choices=POLICIES, help="routing.policy")

    check = sub.add_parser("check-config", help="validate a router.yaml and exit")
    check.add_argument("--config", required=True)

    nginx = sub.add_parser("nginx-config", help="render an nginx config for the replicas")
    nginx.add_argument("--config", required=True)
    nginx.add_argument("--out", help="write here instead of stdout")
    nginx.add_argument("--listen", default="8080",
                       help="nginx listen address for the server block (default 8080)")
    nginx.add_argument("--standalone", action="store_true",
                       help="a complete nginx.conf (events/http blocks) instead of a conf.d snippet")

    hk = sub.add_parser("hash-key", help="print the X-Prefix-Hash of a request body on stdin")
    hk.add_argument("--path", default="/v1/chat/completions")
    hk.add_argument("--config", help="use routing.* key settings from this router.yaml")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command: str = args.command
    if command == "serve":
        return serve(args)
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
    return hash_key_command(args)


# serve ---------------------------------------------------------------------------------------

def serve(args: argparse.Namespace) -> int:
    settings = _settings(args.config)
    demo = not args.config and not args.backend
    with contextlib.ExitStack() as stack:
        backends: list[str] = list(args.backend)
        names: list[str] | None = None
        if demo:
            fleet = stack.enter_context(_demo_fleet())
            backends, names = list(fleet.urls), list(fleet.names)
        try:
            settings = settings.with_overrides(host=args.host, port=args.port,
                                               workers=args.workers, policy=args.policy,
                                               backends=backends, names=names)
            settings.check_runnable()
        except SettingsError as exc:
            _fail(str(exc))
        if demo:
            _print_demo(settings)
        run_uvicorn(settings)
    return 0


@contextlib.contextmanager
def _demo_fleet() -> Iterator[Any]:
    try:
        fleet_mod = importlib.import_module("loadtest.fleet")
    except ImportError as exc:
        _fail(f"the quick-start demo needs loadtest.fleet ({exc}); "
              "pass --config or --backend instead")
    fleet = fleet_mod.Fleet(replicas=DEMO_REPLICAS)
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.stop()


def _print_demo(settings: Settings) -> None:
    host = settings.listen.host
    base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{settings.listen.port}"
    names = ", ".join(f"{r.name}={r.url}" for r in settings.replicas)
    print(f"""prefix-router quick start: {len(settings.replicas)} simulated vLLM replicas ({names})
router on {base}  (Ctrl-C stops the router and the replicas)

  curl {base}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "sim-model", "messages": [{{"role": "system", "content": "You are a terse \
assistant for the demo fleet. Answer in one line."}}, {{"role": "user", "content": "hello"}}]}}' -i

  python -c "import openai; c = openai.OpenAI(base_url='{base}/v1', api_key='none'); \
print(c.chat.completions.create(model='sim-model', messages=[{{'role': 'user', 'content': 'hi'}}]))"

  curl {base}/metrics | grep prefix_router_requests_total
""", flush=True)


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
    try:
        uvicorn.run("router.app:app_factory", factory=True, workers=settings.workers, **common)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# nginx-config / hash-key ---------------------------------------------------------------------

def nginx_config(args: argparse.Namespace) -> int:
    settings = _settings(args.config)
    from router.nginx_config import render

    try:
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
