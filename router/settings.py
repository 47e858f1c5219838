"""Router settings: the `router.yaml` schema, parsed and validated once at start-up.

Every setting lives here exactly once, as a field of a frozen dataclass with its default; the CLI
only overrides fields (`Settings.with_overrides`) and the app only reads them. Parsing walks the
input mapping section by section with a `_Reader` that consumes keys as it validates them; any key
left over afterwards is unknown and rejected. Every error is a `SettingsError` whose message starts
with the dotted key and quotes the bad value, e.g.
`routing.load_factor: expected a number > 1, got 'abc'`.

`Settings.to_dict()` / `Settings.from_dict()` round-trip exactly (sizes are stored as int bytes),
which is how settings reach uvicorn worker processes: `SETTINGS_ENV` names a JSON file (mode 0600,
so API keys from the YAML do not end up in the environment).
Cost: linear in the size of the document; done once per process.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from router.roles import DEFAULT_ROLE, ROLES, Role

__all__ = [
    "AdminSettings", "AuthSettings", "DEFAULT_SERVICE_NAME", "DISCOVERY_TYPES",
    "DisaggSettings", "DiscoverySettings", "DnsDiscovery", "EPP_ADMIN_PORT", "EPP_BODY_MODES",
    "EppSettings", "HealthSettings", "KubernetesDiscovery",
    "KvEventsSettings", "LOG_LEVELS", "PeersSettings",
    "LimitsSettings", "Listen", "LoggingSettings", "POLICIES", "ProxySettings", "RINGS",
    "PEER_DIR_ENV", "ReplicaSpec", "RoutingSettings", "SCHEMES", "SETTINGS_ENV",
    "ScrapeSettings", "Settings", "SettingsError", "ShutdownSettings", "TracingSettings",
    "kv_installed", "load_settings", "parse_backend", "parse_size", "settings_from_env",
    "write_settings_file"
]

SETTINGS_ENV = "PREFIX_ROUTER_SETTINGS_FILE"
# the directory in which the workers of one `serve --workers N` process claim their sibling
# peer sockets (`Settings.workers_share`), handed to them by the parent like SETTINGS_ENV
PEER_DIR_ENV = "PREFIX_ROUTER_PEER_DIR"

POLICIES = ("prefix", "cache_aware", "round_robin", "least_loaded")
RINGS = ("xxhash", "nginx")
DISCOVERY_TYPES = ("static", "dns", "kubernetes")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
SCHEMES = ("http", "https")

_SIZE = re.compile(r"^\s*(\d+)\s*(B|KB|KiB|MB|MiB|GB|GiB)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2,
               "gb": 1000**3, "gib": 1024**3}
_SELECTOR = re.compile(r"^[\w./-]+=[\w.-]*(,[\w./-]+=[\w.-]*)*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")

class SettingsError(ValueError):
    """A configuration problem; the message names the dotted key and the bad value."""


def parse_size(value: object) -> int:
    """Bytes from an int or a string like `16MiB`; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(value)
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            return int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "b").lower()]
    raise ValueError(value)


class _Reader:
    """Consumes and validates the keys of one mapping; `done()` rejects whatever is left."""

    def __init__(self, data: object, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise SettingsError(f"{path or '<root>'}: expected a mapping, got {data!r}")
        self._data = dict(data)
        self._path = path

    def key(self, name: str) -> str:
        return f"{self._path}.{name}" if self._path else name

    def _fail(self, name: str, expected: str, value: object) -> SettingsError:
        return SettingsError(f"{self.key(name)}: expected {expected}, got {value!r}")

    def raw(self, name: str, default: Any) -> Any:
        return self._data.pop(name, default)

    def sub(self, name: str) -> _Reader:
        return _Reader(self._data.pop(name, None), self.key(name))

    def check(self, name: str, default: Any, expected: str, ok: Callable[[Any], bool],
              convert: Callable[[Any], Any] | None = None) -> Any:
        value = self._data.pop(name, default)
        try:
            good = ok(value)
        except (TypeError, ValueError):
            good = False
        if not good:
            raise self._fail(name, expected, value)
        return convert(value) if convert else value

    def string(self, name: str, default: str) -> str:
        return self.check(name, default, "a non-empty string",
                          lambda v: isinstance(v, str) and v != "")

    def opt_string(self, name: str) -> str | None:
        return self.check(name, None, "a non-empty string or null",
                          lambda v: v is None or (isinstance(v, str) and v != ""))

    def choice(self, name: str, default: str, options: Sequence[str]) -> str:
        return self.check(name, default, "one of " + " | ".join(options),
                          lambda v: isinstance(v, str) and v in options)

    def integer(self, name: str, default: int, lo: int, hi: int | None = None) -> int:
        desc = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
        return self.check(name, default, desc, lambda v: isinstance(v, int)
                          and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi))

    def opt_port(self, name: str) -> int | None:
        return self.check(name, None, "a port in [1, 65535] or null",
                          lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)
                                                  and 1 <= v <= 65535))

    def number(self, name: str, default: float, gt: float | None = None,
               ge: float | None = None) -> float:
        desc = f"a number > {gt:g}" if gt is not None else f"a number >= {ge:g}"
        return self.check(
            name, default, desc,
            lambda v: isinstance(v, int | float) and not isinstance(v, bool)
            and (gt is None or v > gt) and (ge is None or v >= ge),
            float)

    def boolean(self, name: str, default: bool) -> bool:
        return self.check(name, default, "true or false", lambda v: isinstance(v, bool))

    def size(self, name: str, default: int) -> int:
        return self.check(name, default, "a size in bytes (int or e.g. '16MiB')",
                          lambda v: parse_size(v) > 0, parse_size)

    def done(self) -> None:
        if self._data:
            name = min(self._data, key=str)  # YAML keys need not be strings (`3:`)
            raise SettingsError(f"{self.key(str(name))}: unknown key (value {self._data[name]!r})")


def _url_ok(v: object) -> bool:
    if not isinstance(v, str):
        return False
    parts = urlsplit(v)
    _ = parts.port  # raises ValueError on a malformed port
    return parts.scheme in SCHEMES and bool(parts.hostname) and parts.path in ("", "/") \
        and not parts.query and not parts.fragment


_ZMQ_DESC = "a ZMQ endpoint like 'tcp://host:port' or null"


def _zmq_ok(v: object) -> bool:
    if v is None:
        return True
    if not isinstance(v, str) or not v.startswith(("tcp://", "ipc://")):
        return False
    if v.startswith("ipc://"):
        return len(v) > 6
    parts = urlsplit(v)
    return bool(parts.hostname) and parts.port is not None and parts.path == ""


def _url(r: _Reader, name: str) -> str:
    return r.check(name, None, "an http(s) URL like 'http://host:port'", _url_ok,
                   lambda v: str(v).rstrip("/"))


@dataclass(frozen=True)
class Listen:
    host: str = "127.0.0.1"
    port: int = 8000

    @classmethod
    def parse(cls, r: _Reader) -> Listen:
        return cls(host=r.string("host", cls.host), port=r.integer("port", cls.port, 1, 65535))


@dataclass(frozen=True)
class ReplicaSpec:
    name: str
    url: str
    weight: int = 1
    # the model names (base models, LoRA adapters) the replica serves; None: learn them from
    # its /v1/models
    models: tuple[str, ...] | None = None
    # routing.kv_events: this replica's ZMQ endpoints when not <its host>:<port> (static only)
    kv_events_endpoint: str | None = None
    kv_replay_endpoint: str | None = None
    # prefill/decode disaggregation (router.roles): a pool with both a prefill and a decode
    # replica is served in two phases (router.disagg)
    role: Role = DEFAULT_ROLE

    @classmethod
    def parse(cls, r: _Reader) -> ReplicaSpec:
        name: str = r.check("name", None, "a replica name ([A-Za-z0-9_.:-], <= 63 chars)",
                       lambda v: isinstance(v, str) and bool(_NAME.match(v)))
        models = r.check("models", None, "a non-empty list of model names or null",
                         lambda v: v is None or (isinstance(v, list | tuple) and bool(v) and all(
                             isinstance(m, str) and m for m in v)),
                         lambda v: None if v is None else tuple(v))
        return cls(name=name, url=_url(r, "url"), weight=r.integer("weight", 1, 1, 1000),
                   models=models,
                   kv_events_endpoint=r.check("kv_events_endpoint", None, _ZMQ_DESC, _zmq_ok),
                   kv_replay_endpoint=r.check("kv_replay_endpoint", None, _ZMQ_DESC, _zmq_ok),
                   role=Role(r.choice("role", cls.role, ROLES)))


@dataclass(frozen=True)
class DnsDiscovery:
    """`discovery.dns`: the addresses of ``name`` are replicas of role both; those of
    ``prefill`` / ``decode`` (one headless Service per role) replicas of that role."""

    name: str | None = None
    port: int = 8000
    scheme: str = "http"
    interval: float = 5.0
    prefill: str | None = None
    decode: str | None = None

    @classmethod
    def parse(cls, r: _Reader) -> DnsDiscovery:
        return cls(name=r.opt_string("name"), port=r.integer("port", cls.port, 1, 65535),
                   scheme=r.choice("scheme", cls.scheme, SCHEMES),
                   interval=r.number("interval", cls.interval, gt=0),
                   prefill=r.opt_string("prefill"), decode=r.opt_string("decode"))

    def names(self) -> tuple[tuple[str, Role], ...]:
        """The host names polled, each with the role of its addresses."""
        pairs = ((self.name, Role.BOTH), (self.prefill, Role.PREFILL),
                 (self.decode, Role.DECODE))
        return tuple((n, role) for n, role in pairs if n is not None)


@dataclass(frozen=True)
class KubernetesDiscovery:
    namespace: str = "default"
    service: str = "vllm"
    port_name: str = "http"
    scheme: str = "http"
    kubeconfig: str | None = None
    # `k=v[,k=v]` over EndpointSlice labels, instead of `service`: one router over several
    # Services (one per model; Kubernetes copies a Service's labels onto its slices)
    selector: str | None = None

    @classmethod
    def parse(cls, r: _Reader) -> KubernetesDiscovery:
        return cls(namespace=r.string("namespace", cls.namespace),
                   service=r.string("service", cls.service),
                   port_name=r.string("port_name", cls.port_name),
                   scheme=r.choice("scheme", cls.scheme, SCHEMES),
                   kubeconfig=r.opt_string("kubeconfig"),
                   selector=r.check("selector", None, "a label selector 'k=v[,k=v]' or null",
                                    lambda v: v is None or (isinstance(v, str) and bool(
                                        _SELECTOR.match(v)))))


@dataclass(frozen=True)
class DiscoverySettings:
    type: str = "static"
    dns: DnsDiscovery = field(default_factory=DnsDiscovery)
    kubernetes: KubernetesDiscovery = field(default_factory=KubernetesDiscovery)

    @classmethod
    def parse(cls, r: _Reader) -> DiscoverySettings:
        kind = r.choice("type", "static", DISCOVERY_TYPES)
        dns_r = r.sub("dns")
        dns = DnsDiscovery.parse(dns_r)
        dns_r.done()
        k8s_r = r.sub("kubernetes")
        k8s = KubernetesDiscovery.parse(k8s_r)
        k8s_r.done()
        if kind == "dns" and not dns.names():
            raise SettingsError(f"{dns_r.key('name')}: required when discovery.type is dns "
                                "(or discovery.dns.prefill / decode), got None")
        return cls(type=kind, dns=dns, kubernetes=k8s)


@dataclass(frozen=True)
class KvEventsSettings:
    """`routing.kv_events`: subscribe to every replica's vLLM KV-cache events
    (`router.kv_events`, needs the `kv` extra). A replica's endpoint is
    ``tcp://<its URL's host>:<port>`` (a Kubernetes pod IP works as-is) unless its static entry
    names ``kv_events_endpoint``; its replay endpoint the same with ``replay_port`` (null: no
    replay - a gap then drops the replica's entries). ``topic`` is vLLM's
    ``KVEventsConfig.topic``. ``replay_timeout``: how long a replay may stay silent before it
    counts as failed; ``speculative_ttl``: how long a routing decision counts as cached on its
    replica before that replica's own events confirm it."""

    enabled: bool = False
    port: int = 5557
    replay_port: int | None = 5558
    topic: str = ""
    replay_timeout: float = 2.0
    speculative_ttl: float = 2.0
    retry_max: float = 30.0  # backoff cap between failed resyncs of one replica

    @classmethod
    def parse(cls, r: _Reader) -> KvEventsSettings:
        replay = r.raw("replay_port", cls.replay_port)
        if replay is not None and not (isinstance(replay, int) and not isinstance(replay, bool)
                                       and 1 <= replay <= 65535):
            raise SettingsError(f"{r.key('replay_port')}: expected a port in [1, 65535] or null, "
                                f"got {replay!r}")
        return cls(enabled=r.boolean("enabled", cls.enabled),
                   port=r.integer("port", cls.port, 1, 65535),
                   replay_port=replay,
                   topic=r.check("topic", cls.topic, "a string",
                                 lambda v: isinstance(v, str)),
                   replay_timeout=r.number("replay_timeout", cls.replay_timeout, gt=0),
                   speculative_ttl=r.number("speculative_ttl", cls.speculative_ttl, ge=0),
                   retry_max=r.number("retry_max", cls.retry_max, gt=0))


def _peer_endpoint(v: object) -> bool:
    return v is not None and _zmq_ok(v)


@dataclass(frozen=True)
class PeersSettings:
    """`routing.peers`: share in-flight routing state with the other router processes
    (`router.peers`, needs the `kv` extra). This process publishes its attempts on a ZMQ PUB
    socket bound to ``bind`` or, when that is null, to ``tcp://<host>:<port>`` - with
    ``workers`` > 1 each worker takes the first free port of ``port .. port + workers - 1`` and
    subscribes to the others at ``127.0.0.1`` (``host`` when it is a specific address). It
    subscribes to every entry of ``endpoints`` and, when ``dns`` names a host (a Kubernetes
    headless Service), to each of its addresses at those ports, resolved every
    ``dns_interval`` seconds. ``heartbeat``: seconds between this process's hello messages;
    ``timeout``: a peer silent this long loses its mirrored attempts; ``ttl``: a mirrored
    attempt ends by itself this long after its start.

    ``siblings`` (on by default): while ``enabled`` is false, the workers of one
    ``serve --workers N`` process (N > 1) still share their state with each other, over
    ``ipc://`` sockets in the parent's private directory (`Settings.workers_share`); ``enabled:
    true`` replaces that with the configuration above; ``siblings: false`` turns it off."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 5570
    bind: str | None = None
    endpoints: tuple[str, ...] = ()
    dns: str | None = None
    dns_interval: float = 5.0
    heartbeat: float = 1.0
    timeout: float = 5.0
    ttl: float = 30.0
    siblings: bool = True

    @classmethod
    def parse(cls, r: _Reader) -> PeersSettings:
        s = cls(enabled=r.boolean("enabled", cls.enabled),
                siblings=r.boolean("siblings", cls.siblings),
                host=r.string("host", cls.host),
                port=r.integer("port", cls.port, 1, 65535),
                bind=r.check("bind", None, _ZMQ_DESC, _zmq_ok),
                endpoints=r.check("endpoints", [], "a list of ZMQ endpoints like "
                                  "'tcp://host:port' or 'ipc:///path'",
                                  lambda v: isinstance(v, list | tuple)
                                  and all(_peer_endpoint(e) for e in v), tuple),
                dns=r.opt_string("dns"),
                dns_interval=r.number("dns_interval", cls.dns_interval, gt=0),
                heartbeat=r.number("heartbeat", cls.heartbeat, gt=0),
                timeout=r.number("timeout", cls.timeout, gt=0),
                ttl=r.number("ttl", cls.ttl, gt=0))
        if s.timeout <= s.heartbeat:
            raise SettingsError(f"{r.key('timeout')}: expected a number > heartbeat "
                                f"({s.heartbeat:g}), got {s.timeout!r}")
        return s


@dataclass(frozen=True)
class RoutingSettings:
    policy: str = "cache_aware"
    ring: str = "xxhash"
    virtual_nodes: int = 160
    load_factor: float = 1.25
    load_floor: int = 8
    min_prefix_chars: int = 64
    max_prefix_chars: int = 65536
    key_header: str = "X-Prefix-Hash"
    session_header: str = "X-Session-ID"
    prompt_affinity: bool = True  # accepted, no effect: cache_aware supersedes the affinities
    # cache_aware (router/pipeline.py): scorer weights, the cost model, the prefix index
    cache_weight: float = 16.0
    first_turn_cache_weight: float = 2.0
    load_weight: float = 1.0
    home_weight: float = 0.02
    decode_tokens: float = 32.0
    kv_high: float = 0.9
    cache_load_floor: int = 32
    min_match_tokens: int = 64
    match_threshold: float = 0.3
    chunk_chars: int = 1024
    chars_per_token: float = 4.0
    kv_capacity_tokens: int = 262144
    index_max_entries: int = 65536
    hold_tokens: int = 256
    hold_timeout: float = 2.0
    rate_factor: float = 2.0
    rate_window: float = 8.0
    rate_first_turns: bool = True
    rate_min_follow_tokens: float = 512.0
    share_factor: float = 0.0  # off: measured to cost hit rate against sglang-router (docs/router.md)
    share_slack: float = 6.0
    share_window: float = 256.0
    # precise routing from the replicas' KV-cache events (cache_aware only): the files the
    # router renders and tokenises requests with, exactly as the replicas' vLLM does
    kv_events: KvEventsSettings = field(default_factory=KvEventsSettings)
    # several router processes: each one's in-flight requests mirrored into the others'
    peers: PeersSettings = field(default_factory=PeersSettings)
    tokenizer: str | None = None  # a tokenizer.json (or its directory); null: the default one
    chat_template: str | None = None  # null: the tokenizer's bundled template, else ChatML

    @classmethod
    def parse(cls, r: _Reader) -> RoutingSettings:
        s = cls(policy=r.choice("policy", cls.policy, POLICIES),
                ring=r.choice("ring", cls.ring, RINGS),
                virtual_nodes=r.integer("virtual_nodes", cls.virtual_nodes, 1, 10000),
                load_factor=r.number("load_factor", cls.load_factor, gt=1),
                load_floor=r.integer("load_floor", cls.load_floor, 0, 1_000_000),
                min_prefix_chars=r.integer("min_prefix_chars", cls.min_prefix_chars, 0),
                max_prefix_chars=r.integer("max_prefix_chars", cls.max_prefix_chars, 1),
                key_header=r.string("key_header", cls.key_header),
                session_header=r.string("session_header", cls.session_header),
                prompt_affinity=r.boolean("prompt_affinity", cls.prompt_affinity),
                cache_weight=r.number("cache_weight", cls.cache_weight, ge=0),
                first_turn_cache_weight=r.number("first_turn_cache_weight",
                                                 cls.first_turn_cache_weight, ge=0),
                load_weight=r.number("load_weight", cls.load_weight, ge=0),
                home_weight=r.number("home_weight", cls.home_weight, ge=0),
                decode_tokens=r.number("decode_tokens", cls.decode_tokens, ge=0),
                kv_high=r.check("kv_high", cls.kv_high, "a number in [0, 1)",
                                lambda v: isinstance(v, int | float) and not isinstance(v, bool)
                                and 0 <= v < 1, float),
                cache_load_floor=r.integer("cache_load_floor", cls.cache_load_floor, 0,
                                           1_000_000),
                min_match_tokens=r.integer("min_match_tokens", cls.min_match_tokens, 0),
                match_threshold=r.check("match_threshold", cls.match_threshold,
                                        "a number in [0, 1]",
                                        lambda v: isinstance(v, int | float)
                                        and not isinstance(v, bool) and 0 <= v <= 1, float),
                chunk_chars=r.integer("chunk_chars", cls.chunk_chars, 16, 1 << 20),
                chars_per_token=r.number("chars_per_token", cls.chars_per_token, gt=0),
                kv_capacity_tokens=r.integer("kv_capacity_tokens", cls.kv_capacity_tokens, 1),
                index_max_entries=r.integer("index_max_entries", cls.index_max_entries, 1),
                hold_tokens=r.integer("hold_tokens", cls.hold_tokens, 0),
                hold_timeout=r.number("hold_timeout", cls.hold_timeout, gt=0),
                rate_factor=r.check("rate_factor", cls.rate_factor, "0 (off) or a number >= 1",
                                    lambda v: isinstance(v, int | float)
                                    and not isinstance(v, bool) and (v == 0 or v >= 1), float),
                rate_window=r.number("rate_window", cls.rate_window, ge=1),
                rate_first_turns=r.boolean("rate_first_turns", cls.rate_first_turns),
                rate_min_follow_tokens=r.number("rate_min_follow_tokens",
                                                cls.rate_min_follow_tokens, ge=0),
                share_factor=r.check("share_factor", cls.share_factor,
                                     "0 (off) or a number >= 1",
                                     lambda v: isinstance(v, int | float)
                                     and not isinstance(v, bool) and (v == 0 or v >= 1), float),
                share_slack=r.number("share_slack", cls.share_slack, ge=0),
                share_window=r.number("share_window", cls.share_window, ge=1),
                kv_events=_section(r, "kv_events", KvEventsSettings),
                peers=_section(r, "peers", PeersSettings),
                tokenizer=r.opt_string("tokenizer"),
                chat_template=r.opt_string("chat_template"))
        if s.kv_events.enabled and s.policy != "cache_aware":
            raise SettingsError(f"{r.key('kv_events.enabled')}: needs routing.policy "
                                f"cache_aware, got policy {s.policy!r}")
        if s.cache_weight + s.load_weight + s.home_weight <= 0:
            raise SettingsError(f"{r.key('cache_weight')}: expected the cache, load and home "
                                f"weights not all 0, got {s.cache_weight!r}")
        if s.max_prefix_chars < s.min_prefix_chars:
            raise SettingsError(f"{r.key('max_prefix_chars')}: expected an integer >= "
                                f"min_prefix_chars ({s.min_prefix_chars}), "
                                f"got {s.max_prefix_chars!r}")
        return s


def _section(r: _Reader, name: str, cls: Any) -> Any:
    sub = r.sub(name)
    value = cls.parse(sub)
    sub.done()
    return value


@dataclass(frozen=True)
class HealthSettings:
    interval: float = 2.0
    timeout: float = 1.0
    eject_after: int = 3
    readmit_backoff: float = 1.0
    readmit_backoff_max: float = 30.0

    @classmethod
    def parse(cls, r: _Reader) -> HealthSettings:
        s = cls(interval=r.number("interval", cls.interval, gt=0),
                timeout=r.number("timeout", cls.timeout, gt=0),
                eject_after=r.integer("eject_after", cls.eject_after, 1),
                readmit_backoff=r.number("readmit_backoff", cls.readmit_backoff, gt=0),
                readmit_backoff_max=r.number("readmit_backoff_max", cls.readmit_backoff_max, gt=0))
        if s.readmit_backoff_max < s.readmit_backoff:
            raise SettingsError(f"{r.key('readmit_backoff_max')}: expected a number >= "
                                f"readmit_backoff ({s.readmit_backoff:g}), "
                                f"got {s.readmit_backoff_max!r}")
        return s


@dataclass(frozen=True)
class ScrapeSettings:
    interval: float = 1.0
    enabled: bool = True
    # seconds a replica's last good load stays in use while its scrapes fail (0: zero at once)
    stale_after: float = 5.0

    @classmethod
    def parse(cls, r: _Reader) -> ScrapeSettings:
        return cls(interval=r.number("interval", cls.interval, gt=0),
                   enabled=r.boolean("enabled", cls.enabled),
                   stale_after=r.number("stale_after", cls.stale_after, ge=0))


@dataclass(frozen=True)
class ProxySettings:
    connect_timeout: float = 2.0
    first_byte_timeout: float = 300.0
    idle_timeout: float = 60.0
    max_attempts: int = 3
    max_body_bytes: int = 16 * 1024 * 1024
    max_in_flight: int = 1024
    replica_header: bool = True

    @classmethod
    def parse(cls, r: _Reader) -> ProxySettings:
        return cls(connect_timeout=r.number("connect_timeout", cls.connect_timeout, gt=0),
                   first_byte_timeout=r.number("first_byte_timeout", cls.first_byte_timeout, gt=0),
                   idle_timeout=r.number("idle_timeout", cls.idle_timeout, gt=0),
                   max_attempts=r.integer("max_attempts", cls.max_attempts, 1, 100),
                   max_body_bytes=r.size("max_body_bytes", cls.max_body_bytes),
                   max_in_flight=r.integer("max_in_flight", cls.max_in_flight, 1),
                   replica_header=r.boolean("replica_header", cls.replica_header))


@dataclass(frozen=True)
class DisaggSettings:
    """Prefill/decode disaggregation (`router.disagg`; on for a model pool with both a prefill
    and a decode replica). ``prefill_timeout``: the whole prefill phase, retries included
    (each attempt is also bounded by ``proxy.first_byte_timeout``); the decode phase has the
    proxy's timeouts. ``max_prefill_response``: the largest prefill answer read back (it is
    one token and the transfer params)."""

    prefill_timeout: float = 120.0
    max_prefill_response: int = 1024 * 1024

    @classmethod
    def parse(cls, r: _Reader) -> DisaggSettings:
        return cls(prefill_timeout=r.number("prefill_timeout", cls.prefill_timeout, gt=0),
                   max_prefill_response=r.size("max_prefill_response", cls.max_prefill_response))


@dataclass(frozen=True)
class LimitsSettings:
    """Connection-level limits (`router/limits.py` enforces them; docs/router.md compares each
    with its nginx counterpart). 0 for `max_connections_per_client` means no per-client cap."""

    header_timeout: float = 60.0
    body_timeout: float = 60.0
    body_min_rate: int = 8 * 1024
    keepalive_timeout: float = 75.0
    max_request_line: int = 8 * 1024
    max_header_count: int = 100
    max_header_bytes: int = 32 * 1024
    max_connections: int = 4096
    max_connections_per_client: int = 0

    @classmethod
    def parse(cls, r: _Reader) -> LimitsSettings:
        s = cls(header_timeout=r.number("header_timeout", cls.header_timeout, gt=0),
                body_timeout=r.number("body_timeout", cls.body_timeout, gt=0),
                body_min_rate=r.size("body_min_rate", cls.body_min_rate),
                keepalive_timeout=r.number("keepalive_timeout", cls.keepalive_timeout, gt=0),
                max_request_line=r.size("max_request_line", cls.max_request_line),
                max_header_count=r.integer("max_header_count", cls.max_header_count, 1, 100_000),
                max_header_bytes=r.size("max_header_bytes", cls.max_header_bytes),
                max_connections=r.integer("max_connections", cls.max_connections, 1),
                max_connections_per_client=r.integer("max_connections_per_client",
                                                     cls.max_connections_per_client, 0))
        if s.max_connections_per_client > s.max_connections:
            raise SettingsError(f"{r.key('max_connections_per_client')}: expected an integer <= "
                                f"max_connections ({s.max_connections}) or 0 (off), "
                                f"got {s.max_connections_per_client!r}")
        return s


@dataclass(frozen=True)
class AuthSettings:
    api_keys: tuple[str, ...] = ()
    api_keys_env: str | None = None
    upstream_api_key_env: str | None = None

    @classmethod
    def parse(cls, r: _Reader) -> AuthSettings:
        keys: tuple[str, ...] = r.check("api_keys", [], "a list of non-empty strings",
                       lambda v: isinstance(v, list) and all(isinstance(k, str) and k for k in v),
                       tuple)
        return cls(api_keys=keys, api_keys_env=r.opt_string("api_keys_env"),
                   upstream_api_key_env=r.opt_string("upstream_api_key_env"))

    def client_keys(self, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
        """Accepted client keys: `api_keys` plus the comma-separated `api_keys_env` variable."""
        keys = list(self.api_keys)
        if self.api_keys_env:
            keys += [k.strip() for k in environ.get(self.api_keys_env, "").split(",") if k.strip()]
        return tuple(keys)

    def upstream_key(self, environ: Mapping[str, str] = os.environ) -> str | None:
        if not self.upstream_api_key_env:
            return None
        return environ.get(self.upstream_api_key_env) or None


@dataclass(frozen=True)
class AdminSettings:
    host: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, r: _Reader) -> AdminSettings:
        return cls(host=r.opt_string("host"), port=r.opt_port("port"))

    @property
    def enabled(self) -> bool:
        return self.port is not None


EPP_BODY_MODES = ("full_duplex_streamed", "buffered")
EPP_ADMIN_PORT = 9090  # `prefix-router epp` serves /metrics here unless admin.port is set


@dataclass(frozen=True)
class EppSettings:
    """`prefix-router epp` (`router.epp`): the Gateway API Inference Extension endpoint picker.
    ``host`` null: ``listen.host``; ``port`` 0: one the kernel picks. ``body_mode`` is the gateway's ext_proc request body mode,
    used only for a stream whose first message carries no ``protocol_config`` (Envoy sends it
    from 1.35 on). ``metadata_namespace`` wraps the picked endpoints in the dynamic metadata
    (GIE's default ``envoy.lb``)."""

    host: str | None = None
    port: int = 9002
    body_mode: str = "full_duplex_streamed"
    metadata_namespace: str = "envoy.lb"

    @classmethod
    def parse(cls, r: _Reader) -> EppSettings:
        return cls(host=r.opt_string("host"), port=r.integer("port", cls.port, 0, 65535),
                   body_mode=r.choice("body_mode", cls.body_mode, EPP_BODY_MODES),
                   metadata_namespace=r.check("metadata_namespace", cls.metadata_namespace,
                                              "a non-empty string",
                                              lambda v: isinstance(v, str) and bool(v)))


@dataclass(frozen=True)
class LoggingSettings:
    level: str = "info"
    access_log: bool = True
    log_prompts: bool = False

    @classmethod
    def parse(cls, r: _Reader) -> LoggingSettings:
        return cls(level=r.choice("level", cls.level, LOG_LEVELS),
                   access_log=r.boolean("access_log", cls.access_log),
                   log_prompts=r.boolean("log_prompts", cls.log_prompts))


@dataclass(frozen=True)
class ShutdownSettings:
    grace_period: float = 30.0

    @classmethod
    def parse(cls, r: _Reader) -> ShutdownSettings:
        return cls(grace_period=r.number("grace_period", cls.grace_period, ge=0))


@dataclass(frozen=True)
class TracingSettings:
    """OpenTelemetry traces (`router.tracing`, needs the `otel` extra). A field left null defers
    to its standard OTEL_* variable and then to the SDK's own default; a value set here wins
    over the variable, as a constructor argument does in the OTel SDK. `OTEL_SDK_DISABLED=true`
    keeps tracing off whatever `enabled` says."""

    enabled: bool = False
    # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces
    endpoint: str | None = None
    # OTEL_SERVICE_NAME, else service.name in OTEL_RESOURCE_ATTRIBUTES, else DEFAULT_SERVICE_NAME
    service_name: str | None = None
    # ParentBased(TraceIdRatioBased(ratio)); null: OTEL_TRACES_SAMPLER(_ARG), else
    # parentbased_always_on
    sample_ratio: float | None = None
    # routing-key values (a prefix digest, a session id or `user`) on spans: off unless asked
    record_routing_keys: bool = False

    @classmethod
    def parse(cls, r: _Reader) -> TracingSettings:
        ratio = r.check("sample_ratio", None, "a number in [0, 1] or null",
                        lambda v: v is None or (isinstance(v, int | float)
                                                and not isinstance(v, bool) and 0 <= v <= 1))
        return cls(enabled=r.boolean("enabled", cls.enabled),
                   endpoint=r.check("endpoint", None, "an http(s) URL or null",
                                    lambda v: v is None or _endpoint_ok(v)),
                   service_name=r.opt_string("service_name"),
                   sample_ratio=None if ratio is None else float(ratio),
                   record_routing_keys=r.boolean("record_routing_keys", cls.record_routing_keys))


DEFAULT_SERVICE_NAME = "prefix-router"


def _endpoint_ok(v: object) -> bool:
    if not isinstance(v, str):
        return False
    parts = urlsplit(v)
    _ = parts.port  # raises ValueError on a malformed port
    return parts.scheme in SCHEMES and bool(parts.hostname)


_SECTIONS: dict[str, Any] = {
    "listen": Listen, "discovery": DiscoverySettings, "routing": RoutingSettings,
    "health": HealthSettings, "scrape": ScrapeSettings, "proxy": ProxySettings,
    "disagg": DisaggSettings, "limits": LimitsSettings, "auth": AuthSettings, "admin": AdminSettings,
    "logging": LoggingSettings, "shutdown": ShutdownSettings, "tracing": TracingSettings,
    "epp": EppSettings,
}


@dataclass(frozen=True)
class Settings:
    listen: Listen = field(default_factory=Listen)
    workers: int = 1
    replicas: tuple[ReplicaSpec, ...] = ()
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    routing: RoutingSettings = field(default_factory=RoutingSettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    scrape: ScrapeSettings = field(default_factory=ScrapeSettings)
    proxy: ProxySettings = field(default_factory=ProxySettings)
    disagg: DisaggSettings = field(default_factory=DisaggSettings)
    limits: LimitsSettings = field(default_factory=LimitsSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    admin: AdminSettings = field(default_factory=AdminSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    shutdown: ShutdownSettings = field(default_factory=ShutdownSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    epp: EppSettings = field(default_factory=EppSettings)

    @classmethod
    def from_dict(cls, data: object) -> Settings:
        root = _Reader(data, "")
        sections: dict[str, Any] = {}
        for name, section in _SECTIONS.items():
            r = root.sub(name)
            sections[name] = section.parse(r)
            r.done()
        workers = root.integer("workers", 1, 1, 64)
        replicas = _parse_replicas(root.raw("replicas", None))
        root.done()
        peers = sections["routing"].peers
        if peers.enabled and workers > 1 and peers.bind is not None:
            raise SettingsError(f"routing.peers.bind: with workers > 1 every worker binds its "
                                f"own port (host, port), got {peers.bind!r}")
        if peers.port + workers - 1 > 65535:
            raise SettingsError(f"routing.peers.port: expected a port <= {65536 - workers} "
                                f"with {workers} workers, got {peers.port!r}")
        return cls(workers=workers, replicas=replicas, **sections)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["replicas"] = [dict(r) for r in d["replicas"]]
        d["auth"]["api_keys"] = list(d["auth"]["api_keys"])
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def with_overrides(self, *, host: str | None = None, port: int | None = None,
                       workers: int | None = None, policy: str | None = None,
                       backends: Sequence[str] = (),
                       names: Sequence[str] | None = None) -> Settings:
        """CLI flags over the file: each given flag is validated as its YAML key would be."""
        d = self.to_dict()
        if host is not None:
            d["listen"]["host"] = host
        if port is not None:
            d["listen"]["port"] = port
        if workers is not None:
            d["workers"] = workers
        if policy is not None:
            d["routing"]["policy"] = policy
        if backends:
            d["replicas"] = [parse_backend(b, i) for i, b in enumerate(backends)]
            for replica, name in zip(d["replicas"], names or (), strict=False):
                replica["name"] = name
            d["discovery"]["type"] = "static"
        return Settings.from_dict(d)

    @property
    def workers_share(self) -> bool:
        """Whether the ``workers`` processes share routing state among themselves by default
        (sibling peers over ipc sockets): more than one worker, ``routing.peers.enabled`` false
        (an explicit peer configuration wins) and ``routing.peers.siblings`` true."""
        p = self.routing.peers
        return self.workers > 1 and not p.enabled and p.siblings

    def with_epp_overrides(self, *, host: str | None = None, port: int | None = None,
                           admin_host: str | None = None, admin_port: int | None = None,
                           body_mode: str | None = None) -> Settings:
        """`prefix-router epp` flags over the file, validated as their YAML keys would be."""
        d = self.to_dict()
        for section, key, value in (("epp", "host", host), ("epp", "port", port),
                                    ("admin", "host", admin_host), ("admin", "port", admin_port),
                                    ("epp", "body_mode", body_mode)):
            if value is not None:
                d[section][key] = value
        return Settings.from_dict(d)

    def check_runnable(self) -> None:
        """Cross-section checks that only matter when serving (not when rendering configs)."""
        if self.discovery.type == "static" and not self.replicas:
            raise SettingsError("replicas: static discovery needs at least one replica, got []")
        if self.routing.kv_events.enabled and not kv_installed():
            raise SettingsError("routing.kv_events.enabled: true needs the kv extra "
                                "(pip install 'prefix-router[kv]'), got True")
        if self.routing.peers.enabled and not kv_installed():
            raise SettingsError("routing.peers.enabled: true needs the kv extra "
                                "(pip install 'prefix-router[kv]'), got True")
        if self.tracing.enabled and not _otel_installed():
            raise SettingsError("tracing.enabled: true needs the otel extra "
                                "(pip install 'prefix-router[otel]'), got True")


def _otel_installed() -> bool:
    """Whether the `otel` extra's packages can be imported (looked up, not imported)."""
    try:
        return all(importlib.util.find_spec(m) is not None for m in (
            "opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"))
    except ImportError:  # a parent package is missing
        return False


def kv_installed() -> bool:
    """Whether the `kv` extra's packages (pyzmq, msgpack) can be imported."""
    return all(importlib.util.find_spec(m) is not None for m in ("zmq", "msgpack"))


def parse_backend(text: str, index: int) -> dict[str, Any]:
    """A ``--backend`` value as its ``replicas[index]`` entry: ``URL``, ``NAME=URL``,
    ``URL=WEIGHT`` or ``NAME=URL=WEIGHT`` (a URL has no ``=`` of its own: replicas are base URLs).
    Unnamed replicas are ``r<index>``; the entry is validated with the rest of the settings."""
    parts = text.split("=")
    if len(parts) > 3:
        raise SettingsError(f"--backend: expected [NAME=]URL[=WEIGHT], got {text!r}")
    entry: dict[str, Any] = {"name": f"r{index}", "url": parts[-1]}
    if len(parts) == 3 or (len(parts) == 2 and "://" in parts[0]):
        try:
            entry["weight"] = int(parts.pop())
        except ValueError:
            raise SettingsError(f"--backend: weight must be an integer, got {text!r}") from None
    if len(parts) == 2:
        entry["name"] = parts[0]
    entry["url"] = parts[-1]
    return entry


def _parse_replicas(value: object) -> tuple[ReplicaSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SettingsError(f"replicas: expected a list of {{name, url, weight}}, got {value!r}")
    out: list[ReplicaSpec] = []
    for i, item in enumerate(value):
        r = _Reader(item, f"replicas[{i}]")
        spec = ReplicaSpec.parse(r)
        r.done()
        if any(o.name == spec.name for o in out):
            raise SettingsError(f"replicas[{i}].name: duplicate replica name, got {spec.name!r}")
        if any(o.url == spec.url for o in out):
            raise SettingsError(f"replicas[{i}].url: duplicate replica url, got {spec.url!r}")
        out.append(spec)
    return tuple(out)


def load_settings(path: str | os.PathLike[str]) -> Settings:
    """Read and validate a YAML file; SettingsError (naming the file) on any problem."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise SettingsError(f"{os.fspath(path)}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise SettingsError(f"{os.fspath(path)}: invalid YAML ({_one_line(str(exc))})") from exc
    return Settings.from_dict(data)


def write_settings_file(settings: Settings, path: str | os.PathLike[str]) -> None:
    """The JSON a worker process reads back with `settings_from_env` (owner-only permissions)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(settings.to_json())


def settings_from_env(environ: Mapping[str, str] = os.environ) -> Settings:
    """Settings handed to a uvicorn worker process: the JSON file named by `SETTINGS_ENV`."""
    path = environ.get(SETTINGS_ENV)
    if not path:
        raise SettingsError(f"{SETTINGS_ENV}: not set (start workers via `prefix-router serve`)")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise SettingsError(f"{SETTINGS_ENV}: cannot read {path!r} ({exc})") from exc
    return Settings.from_dict(data)


def _one_line(text: str) -> str:
    return " ".join(text.split())
