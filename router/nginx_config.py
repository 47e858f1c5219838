"""Render an nginx config that routes exactly like the router with ``routing.ring: nginx``.

``render(settings)`` maps the router's settings onto :class:`NginxOptions` and renders
``router/templates/nginx.conf.j2`` (also at ``nginx/prefix-router.conf.j2``); ``render_config(replicas, options)`` is the same without a
``Settings`` object. Output is either a conf.d snippet (``map`` + ``upstream`` + ``server``, to
include inside ``http {}``) or, with ``standalone=True``, a whole nginx.conf whose relative paths
live under nginx's ``-p`` prefix (tests, demos).

Several models (any replica with ``models`` in its settings): one upstream per distinct set of
replicas serving a model (``<upstream>_<i>``), and a ``map`` from the ``X-Model`` request header
(`router.client.routing_headers` sets it; nginx cannot read the JSON body) to the model's
upstream. A model no replica lists, or a missing header, is answered by nginx itself with the
router's 404 ``model_not_found`` body (OpenAI format). Each upstream is its own ketama ring over
its replicas, which is where the router's walk over the whole ring, filtered to the model's pool,
lands too (a server's points depend only on its own address), so parity holds per model.

Invariants: the upstream lists one ``server host:port`` per replica, sorted by name, with the
replica's weight, where ``host:port`` is ``router.replicas.address_of(url)`` - the same string
the router hands to ``router.ring.nginx.NginxRing`` - so nginx and the router build the same
ring. Every value that reaches the template is validated here, so a rendered file cannot carry
injected directives. Rendering is pure (reads only the template file) and linear in the replicas.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

import jinja2

from router.client import MODEL_HEADER
from router.errors import ModelNotFound, error_body
from router.replicas import address_of
from router.settings import Settings

__all__ = ["TEMPLATE_PATH", "ModelPool", "NginxOptions", "UpstreamServer", "model_pools",
           "render", "render_config"]

# Shipped inside the package (wheel-safe); nginx/prefix-router.conf.j2 is a symlink to it.
TEMPLATE_PATH = Path(__file__).resolve().parent / "templates" / "nginx.conf.j2"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")
_HEADER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*$")
_LISTEN = re.compile(r"^(\[[0-9A-Fa-f:.]+\]:|[A-Za-z0-9.-]+:)?\d{1,5}$|^unix:/[\w./-]+$")
_PATH = re.compile(r"^(off|[\w./-]+)$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_MODEL = re.compile(r"^[\w.:/@+=-]{1,256}$")  # safe inside a quoted nginx map key


@dataclass(frozen=True)
class ModelPool:
    """One upstream of a multi-model config: the models it serves and its servers."""

    upstream: str
    models: tuple[str, ...]
    servers: tuple[UpstreamServer, ...]


@dataclass(frozen=True)
class UpstreamServer:
    name: str
    address: str  # host:port, as hashed by nginx's ring
    weight: int = 1


@dataclass(frozen=True)
class NginxOptions:
    """Everything the template needs besides the replicas. Durations are seconds."""

    listen: str = "8080"  # nginx `listen` argument: port, host:port, [v6]:port or unix:/path
    standalone: bool = False
    key_header: str = "X-Prefix-Hash"
    max_body_bytes: int = 16 * 1024 * 1024
    connect_timeout: float = 2.0
    read_timeout: float = 300.0  # max silence between two reads: TTFT and inter-token gaps
    send_timeout: float = 60.0
    max_attempts: int = 3  # proxy_next_upstream_tries
    max_fails: int = 3
    fail_timeout: float = 30.0
    keepalive: int = 64  # idle upstream connections cached per worker
    upstream_keepalive_timeout: float = 4.0  # below uvicorn's 5 s
    replica_header: bool = True
    upstream: str = "prefix_router"
    # None: access.log under the prefix (standalone), else /var/log/nginx/prefix-router.access.log
    access_log: str | None = None
    worker_processes: str = "auto"  # standalone only
    worker_connections: int = 4096  # standalone only
    error_log_level: str = "warn"  # standalone only


def render(settings: Settings, *, listen: str = "8080", standalone: bool = False) -> str:
    """The nginx config for the static replicas of ``settings`` (``prefix-router nginx-config``)."""
    if settings.discovery.type != "static":
        raise ValueError(f"discovery.type: nginx-config needs static replicas, got "
                         f"{settings.discovery.type!r}")
    proxy, health = settings.proxy, settings.health
    options = NginxOptions(
        listen=listen,
        standalone=standalone,
        key_header=settings.routing.key_header,
        max_body_bytes=proxy.max_body_bytes,
        connect_timeout=proxy.connect_timeout,
        # nginx has one read timeout for both the first byte and the gaps between chunks.
        read_timeout=max(proxy.first_byte_timeout, proxy.idle_timeout),
        send_timeout=proxy.idle_timeout,
        max_attempts=proxy.max_attempts,
        max_fails=health.eject_after,
        fail_timeout=health.readmit_backoff_max,
        replica_header=proxy.replica_header,
    )
    given = [r for r in settings.replicas if r.models]
    if given and len(given) != len(settings.replicas):
        missing = next(i for i, r in enumerate(settings.replicas) if not r.models)
        raise ValueError(f"replicas[{missing}].models: nginx cannot learn a replica's models, "
                         f"so every replica needs them once one has them, got None")
    models = {r.name: r.models for r in given if r.models}
    return render_config([(r.name, r.url, r.weight) for r in settings.replicas], options,
                         models=models or None)


def model_pools(servers: Sequence[UpstreamServer], models: Mapping[str, Sequence[str]],
                upstream: str) -> list[ModelPool]:
    """One pool per distinct set of servers serving a model, in order of the sorted model
    names; ValueError on a model name nginx could not carry safely."""
    by_model: dict[str, tuple[UpstreamServer, ...]] = {}
    for model in sorted({m for names in models.values() for m in names}):
        _check(bool(_MODEL.match(model)), "model name", model)
        by_model[model] = tuple(s for s in servers if model in models.get(s.name, ()))
    groups: dict[tuple[UpstreamServer, ...], list[str]] = {}
    for model, members in by_model.items():
        groups.setdefault(members, []).append(model)
    return [ModelPool(f"{upstream}_{i}", tuple(names), members)
            for i, (members, names) in enumerate(groups.items())]


def render_config(replicas: Sequence[tuple[str, str, int]],
                  options: NginxOptions = NginxOptions(), *,
                  models: Mapping[str, Sequence[str]] | None = None) -> str:
    """The nginx config for ``(name, url, weight)`` replicas (``models``: replica name -> the
    models it serves, for one upstream per model); ValueError on any invalid value."""
    servers, scheme = _servers(replicas)
    o = options
    _check(bool(_LISTEN.match(o.listen)), "listen", o.listen)
    _check(bool(_HEADER.match(o.key_header)), "key_header", o.key_header)
    _check(bool(_IDENT.match(o.upstream)), "upstream", o.upstream)
    _check(bool(_IDENT.match(o.worker_processes)) or o.worker_processes.isdigit(),
           "worker_processes", o.worker_processes)
    _check(o.error_log_level in ("debug", "info", "notice", "warn", "error", "crit"),
           "error_log_level", o.error_log_level)
    for field in ("max_body_bytes", "max_attempts", "max_fails", "keepalive", "worker_connections"):
        value = getattr(o, field)
        _check(isinstance(value, int) and value >= 1, field, value)
    access_log = o.access_log or ("access.log" if o.standalone
                                  else "/var/log/nginx/prefix-router.access.log")
    _check(bool(_PATH.match(access_log)), "access_log", access_log)
    pools = model_pools(servers, models, o.upstream) if models else []
    not_found = error_body(ModelNotFound()).decode()
    _check(not re.search(r"['\\$]", not_found), "404 body", not_found)  # one quoted nginx string
    return _template().render(
        servers=servers,
        pools=pools,
        model_var="http_" + MODEL_HEADER.lower().replace("-", "_"),
        model_header=MODEL_HEADER,
        not_found=not_found,
        scheme=scheme,
        key_header=o.key_header,
        key_var="http_" + o.key_header.lower().replace("-", "_"),
        listen=o.listen,
        standalone=o.standalone,
        max_body_bytes=o.max_body_bytes,
        connect_timeout=_duration("connect_timeout", o.connect_timeout),
        read_timeout=_duration("read_timeout", o.read_timeout),
        send_timeout=_duration("send_timeout", o.send_timeout),
        max_attempts=o.max_attempts,
        max_fails=o.max_fails,
        fail_timeout=_duration("fail_timeout", o.fail_timeout),
        keepalive=o.keepalive,
        upstream_keepalive_timeout=_duration("upstream_keepalive_timeout",
                                             o.upstream_keepalive_timeout),
        replica_header=o.replica_header,
        upstream=o.upstream,
        access_log=access_log,
        worker_processes=o.worker_processes,
        worker_connections=o.worker_connections,
        error_log_level=o.error_log_level,
    )


def _servers(replicas: Sequence[tuple[str, str, int]]) -> tuple[list[UpstreamServer], str]:
    if not replicas:
        raise ValueError("replicas: nginx needs at least one replica, got []")
    servers: list[UpstreamServer] = []
    schemes: set[str] = set()
    for name, url, weight in replicas:
        _check(isinstance(name, str) and bool(_NAME.match(name)), "replica name", name)
        parts = urlsplit(url)
        _check(parts.scheme in ("http", "https") and bool(parts.hostname)
               and parts.path in ("", "/") and re.fullmatch(r"[\w.:\[\]-]+", parts.netloc or "")
               is not None, f"replica {name} url", url)
        _check(isinstance(weight, int) and 1 <= weight <= 1000, f"replica {name} weight", weight)
        schemes.add(parts.scheme)
        servers.append(UpstreamServer(name, address_of(url), weight))
    if len(schemes) > 1:
        raise ValueError(f"replicas: one upstream cannot mix http and https, got {sorted(schemes)}")
    for field in ("name", "address"):
        values = [getattr(s, field) for s in servers]
        if len(set(values)) != len(values):
            raise ValueError(f"replicas: duplicate {field}s, got {values}")
    servers.sort(key=lambda s: s.name)  # the order ReplicaSet builds its ring in
    return servers, schemes.pop()


def _duration(field: str, seconds: float) -> str:
    _check(isinstance(seconds, int | float) and seconds > 0, field, seconds)
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def _check(ok: bool, field: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{field}: invalid value for an nginx config, got {value!r}")


@cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_PATH.parent),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return env.get_template(TEMPLATE_PATH.name)
