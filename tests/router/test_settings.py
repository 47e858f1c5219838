from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from router.settings import (
    SETTINGS_ENV,
    Settings,
    SettingsError,
    load_settings,
    parse_size,
    settings_from_env,
    write_settings_file,
)

ONE = [{"name": "r0", "url": "http://127.0.0.1:8101"}]


def test_defaults_match_the_documented_schema() -> None:
    s = Settings.from_dict({})
    assert (s.listen.host, s.listen.port, s.workers) == ("127.0.0.1", 8000, 1)
    assert s.routing.policy == "cache_aware" and s.routing.load_factor == 1.25
    assert s.routing.load_floor == 8
    assert s.routing.prompt_affinity is True
    assert s.routing.virtual_nodes == 160 and s.routing.key_header == "X-Prefix-Hash"
    assert s.proxy.max_body_bytes == 16 * 1024 * 1024 and s.proxy.max_attempts == 3
    assert s.health.eject_after == 3 and s.scrape.enabled is True
    assert s.scrape.stale_after == 5.0
    assert s.admin.enabled is False and s.logging.log_prompts is False
    assert s.shutdown.grace_period == 30.0
    assert s.tracing.enabled is False and s.tracing.record_routing_keys is False
    assert (s.tracing.endpoint, s.tracing.service_name, s.tracing.sample_ratio) == (None,) * 3
    # nginx: client_header_timeout / client_body_timeout 60s, keepalive_timeout 75s,
    # large_client_header_buffers 4 8k (one 8k buffer for the request line)
    lim = s.limits
    assert (lim.header_timeout, lim.body_timeout, lim.keepalive_timeout) == (60.0, 60.0, 75.0)
    assert (lim.max_request_line, lim.max_header_bytes) == (8 * 1024, 32 * 1024)
    assert (lim.body_min_rate, lim.max_header_count) == (8 * 1024, 100)
    assert (lim.max_connections, lim.max_connections_per_client) == (4096, 0)


def test_limits_parse() -> None:
    lim = Settings.from_dict({"limits": {
        "header_timeout": 2, "body_timeout": 1.5, "body_min_rate": "1MiB",
        "keepalive_timeout": 5, "max_request_line": "4KiB", "max_header_count": 50,
        "max_header_bytes": 16384, "max_connections": 10, "max_connections_per_client": 10,
    }}).limits
    assert lim.header_timeout == 2.0 and isinstance(lim.header_timeout, float)
    assert lim.body_min_rate == 1024 * 1024 and lim.max_request_line == 4096
    assert (lim.max_connections, lim.max_connections_per_client) == (10, 10)


def test_full_document_parses() -> None:
    s = Settings.from_dict({
        "listen": {"host": "0.0.0.0", "port": 9000}, "workers": 2,
        "replicas": [{"name": "a", "url": "http://10.0.0.1:8000/", "weight": 2},
                     {"name": "b", "url": "https://b.example:8443"}],
        "discovery": {"type": "static", "dns": {"name": "x.svc", "port": 8000}},
        "routing": {"policy": "least_loaded", "ring": "nginx", "load_factor": 2},
        "proxy": {"max_body_bytes": "1MiB", "max_in_flight": 8},
        "auth": {"api_keys": ["k1"], "api_keys_env": "KEYS"},
        "admin": {"host": "127.0.0.1", "port": 9100},
        "logging": {"level": "debug"}, "shutdown": {"grace_period": 0},
    })
    assert s.replicas[0].url == "http://10.0.0.1:8000"  # trailing slash dropped
    assert s.replicas[0].weight == 2 and s.replicas[1].weight == 1
    assert s.routing.load_factor == 2.0 and isinstance(s.routing.load_factor, float)
    assert s.proxy.max_body_bytes == 1024 * 1024
    assert s.auth.api_keys == ("k1",) and s.admin.enabled


@pytest.mark.parametrize(("doc", "message"), [
    # every error names the dotted key and quotes the bad value
    ({"routing": {"load_factor": "abc"}}, "routing.load_factor: expected a number > 1, got 'abc'"),
    ({"routing": {"load_factor": 1}}, "routing.load_factor: expected a number > 1, got 1"),
    ({"routing": {"load_floor": -1}}, "routing.load_floor"),
    ({"routing": {"rate_factor": 0.5}}, "routing.rate_factor: expected 0 (off) or a number >= 1, got 0.5"),
    ({"routing": {"rate_factor": True}}, "routing.rate_factor: expected 0 (off) or a number >= 1, got True"),
    ({"routing": {"rate_window": 0}}, "routing.rate_window: expected a number >= 1, got 0"),
    ({"routing": {"rate_first_turns": "no"}}, "routing.rate_first_turns: expected true or false, got 'no'"),
    ({"routing": {"share_factor": 0.9}}, "routing.share_factor: expected 0 (off) or a number >= 1, got 0.9"),
    ({"routing": {"share_slack": -1}}, "routing.share_slack: expected a number >= 0, got -1"),
    ({"routing": {"share_window": 0.5}}, "routing.share_window: expected a number >= 1, got 0.5"),
    ({"routing": {"prompt_affinity": "maybe"}}, "routing.prompt_affinity"),
    ({"routing": {"policy": "random"}}, "routing.policy: expected one of prefix | cache_aware | round_robin | least_loaded, got 'random'"),
    ({"routing": {"polcy": "prefix"}}, "routing.polcy: unknown key (value 'prefix')"),
    ({"bogus": 1}, "bogus: unknown key (value 1)"),
    ({3: {"eject_after": 3}}, "3: unknown key (value {'eject_after': 3})"),  # a YAML key that is not a string
    ({"health": {None: 1}}, "health.None: unknown key (value 1)"),
    ({"listen": {"port": 70000}}, "listen.port: expected an integer in [1, 65535], got 70000"),
    ({"listen": {"port": True}}, "listen.port: expected an integer in [1, 65535], got True"),
    ({"workers": 0}, "workers: expected an integer in [1, 64], got 0"),
    ({"proxy": {"max_body_bytes": "lots"}}, "proxy.max_body_bytes: expected a size in bytes (int or e.g. '16MiB'), got 'lots'"),
    ({"proxy": {"connect_timeout": -1}}, "proxy.connect_timeout: expected a number > 0, got -1"),
    ({"health": {"readmit_backoff": 5, "readmit_backoff_max": 1}}, "health.readmit_backoff_max: expected a number >= readmit_backoff (5), got 1.0"),
    ({"scrape": {"enabled": "yes"}}, "scrape.enabled: expected true or false, got 'yes'"),
    ({"scrape": {"stale_after": -1}}, "scrape.stale_after: expected a number >= 0, got -1"),
    ({"replicas": [{"name": "r0", "url": "ftp://h"}]}, "replicas[0].url: expected an http(s) URL like 'http://host:port', got 'ftp://h'"),
    ({"replicas": [{"name": "r0", "url": "http://h:1/v1"}]}, "replicas[0].url: expected an http(s) URL like 'http://host:port', got 'http://h:1/v1'"),
    ({"replicas": [{"name": "r0", "url": "http://h:x"}]}, "replicas[0].url: expected an http(s) URL like 'http://host:port', got 'http://h:x'"),
    ({"replicas": [{"url": "http://h:1"}]}, "replicas[0].name: expected a replica name"),
    ({"replicas": [{"name": "r0", "url": "http://h:1", "port": 3}]}, "replicas[0].port: unknown key (value 3)"),
    ({"replicas": ONE + ONE}, "replicas[1].name: duplicate replica name, got 'r0'"),
    ({"replicas": "http://h:1"}, "replicas: expected a list"),
    ({"routing": ["policy"]}, "routing: expected a mapping, got ['policy']"),
    ({"discovery": {"type": "dns"}}, "discovery.dns.name: required when discovery.type is dns"),
    ({"auth": {"api_keys": "secret"}}, "auth.api_keys: expected a list of non-empty strings"),
    ({"admin": {"port": 0}}, "admin.port: expected a port in [1, 65535] or null, got 0"),
    ({"limits": {"header_timeout": 0}}, "limits.header_timeout: expected a number > 0, got 0"),
    ({"limits": {"body_min_rate": 0}}, "limits.body_min_rate: expected a size in bytes (int or e.g. '16MiB'), got 0"),
    ({"limits": {"max_header_count": 0}}, "limits.max_header_count: expected an integer in [1, 100000], got 0"),
    ({"limits": {"max_header_bytes": "big"}}, "limits.max_header_bytes: expected a size in bytes"),
    ({"limits": {"max_connections": 0}}, "limits.max_connections: expected an integer >= 1, got 0"),
    ({"limits": {"max_connections_per_client": -1}}, "limits.max_connections_per_client: expected an integer >= 0, got -1"),
    ({"limits": {"max_connections": 8, "max_connections_per_client": 9}}, "limits.max_connections_per_client: expected an integer <= max_connections (8) or 0 (off), got 9"),
    ({"limits": {"idle_timeout": 5}}, "limits.idle_timeout: unknown key (value 5)"),
    ({"logging": {"level": "loud"}}, "logging.level: expected one of debug | info | warning | error | critical, got 'loud'"),
    ({"tracing": {"enabled": "on"}}, "tracing.enabled: expected true or false, got 'on'"),
    ({"tracing": {"endpoint": "collector:4318"}}, "tracing.endpoint: expected an http(s) URL or null, got 'collector:4318'"),
    ({"tracing": {"sample_ratio": 2}}, "tracing.sample_ratio: expected a number in [0, 1] or null, got 2"),
    ({"tracing": {"sample_ratio": True}}, "tracing.sample_ratio: expected a number in [0, 1] or null, got True"),
    ({"tracing": {"service_name": ""}}, "tracing.service_name: expected a non-empty string or null, got ''"),
    ({"tracing": {"exporter": "otlp"}}, "tracing.exporter: unknown key (value 'otlp')"),
    # routing.peers
    ({"routing": {"peers": {"enabled": 1}}}, "routing.peers.enabled: expected true or false, got 1"),
    ({"routing": {"peers": {"port": 0}}}, "routing.peers.port: expected an integer in [1, 65535], got 0"),
    ({"routing": {"peers": {"endpoints": "tcp://a:1"}}}, "routing.peers.endpoints: expected a list of ZMQ endpoints"),
    ({"routing": {"peers": {"endpoints": ["a:1"]}}}, "routing.peers.endpoints: expected a list of ZMQ endpoints like 'tcp://host:port' or 'ipc:///path', got ['a:1']"),
    ({"routing": {"peers": {"endpoints": ["tcp://a"]}}}, "routing.peers.endpoints: expected a list of ZMQ endpoints"),  # no port
    ({"routing": {"peers": {"bind": "http://0.0.0.0:5570"}}}, "routing.peers.bind: expected a ZMQ endpoint"),
    ({"routing": {"peers": {"dns": ""}}}, "routing.peers.dns: expected a non-empty string or null, got ''"),
    ({"routing": {"peers": {"dns_interval": 0}}}, "routing.peers.dns_interval: expected a number > 0, got 0"),
    ({"routing": {"peers": {"heartbeat": 2, "timeout": 2}}}, "routing.peers.timeout: expected a number > heartbeat (2), got 2.0"),
    ({"routing": {"peers": {"ttl": -1}}}, "routing.peers.ttl: expected a number > 0, got -1"),
    ({"routing": {"peers": {"peers": []}}}, "routing.peers.peers: unknown key (value [])"),
    ({"workers": 2, "routing": {"peers": {"enabled": True, "bind": "ipc:///tmp/p"}}}, "routing.peers.bind: with workers > 1 every worker binds its own port (host, port), got 'ipc:///tmp/p'"),
    ({"workers": 4, "routing": {"peers": {"port": 65533}}}, "routing.peers.port: expected a port <= 65532 with 4 workers, got 65533"),
])
def test_errors_name_key_and_value(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_dict(doc)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("value", "expected"), [
    (1024, 1024), ("16MiB", 16 * 1024 * 1024), ("2kb", 2000), ("7", 7), (" 1 GiB ", 1024**3),
])
def test_parse_size(value: object, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize("value", [-1, "1.5MiB", "MiB", True, None, 2.0])
def test_parse_size_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_size(value)


def test_round_trip_through_the_worker_settings_file(tmp_path: Path) -> None:
    s = Settings.from_dict({"replicas": ONE, "proxy": {"max_body_bytes": "1KiB"},
                            "auth": {"api_keys": ["a", "b"]}, "admin": {"port": 9100},
                            "tracing": {"enabled": True, "sample_ratio": 0.25,
                                        "endpoint": "http://otel:4318/v1/traces"}})
    assert Settings.from_dict(s.to_dict()) == s
    path = tmp_path / "settings.json"
    write_settings_file(s, path)
    assert path.stat().st_mode & 0o777 == 0o600  # holds API keys
    assert settings_from_env({SETTINGS_ENV: str(path)}) == s
    with pytest.raises(SettingsError, match=SETTINGS_ENV):
        settings_from_env({})
    with pytest.raises(SettingsError, match="cannot read"):
        settings_from_env({SETTINGS_ENV: str(tmp_path / "missing.json")})


def test_overrides_are_validated_like_yaml_keys() -> None:
    s = Settings.from_dict({"replicas": ONE})
    o = s.with_overrides(port=9001, policy="round_robin",
                         backends=["http://127.0.0.1:1", "http://127.0.0.1:2"])
    assert o.listen.port == 9001 and o.routing.policy == "round_robin"
    assert [(r.name, r.url) for r in o.replicas] == [("r0", "http://127.0.0.1:1"),
                                                     ("r1", "http://127.0.0.1:2")]
    assert s.with_overrides().replicas == s.replicas  # nothing given, nothing changed
    with pytest.raises(SettingsError, match=r"listen\.port: expected an integer"):
        s.with_overrides(port=0)
    with pytest.raises(SettingsError, match=r"replicas\[0\].url"):
        s.with_overrides(backends=["localhost:8000"])


def test_check_runnable_needs_replicas_for_static() -> None:
    with pytest.raises(SettingsError, match="replicas: static discovery needs at least one"):
        Settings.from_dict({}).check_runnable()
    Settings.from_dict({"replicas": ONE}).check_runnable()
    Settings.from_dict({"discovery": {"type": "kubernetes"}}).check_runnable()


def test_auth_keys_from_env() -> None:
    a = Settings.from_dict({"auth": {"api_keys": ["k1"], "api_keys_env": "KEYS",
                                     "upstream_api_key_env": "UP"}}).auth
    assert a.client_keys({"KEYS": " k2, ,k3 "}) == ("k1", "k2", "k3")
    assert a.client_keys({}) == ("k1",)
    assert a.upstream_key({"UP": "vllm-key"}) == "vllm-key"
    assert a.upstream_key({}) is None


def test_load_settings_file_errors(tmp_path: Path) -> None:
    good = tmp_path / "router.yaml"
    good.write_text("replicas:\n  - {name: r0, url: 'http://127.0.0.1:8101'}\n"
                    "routing: {policy: round_robin}\n")
    assert load_settings(good).routing.policy == "round_robin"
    bad = tmp_path / "bad.yaml"
    bad.write_text("routing: {policy: [unclosed\n")
    with pytest.raises(SettingsError, match="invalid YAML"):
        load_settings(bad)
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_settings(empty) == Settings()


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(AttributeError):
        s.workers = 3  # type: ignore[misc]
    assert json.loads(s.to_json())["routing"]["policy"] == "cache_aware"


def test_tracing_needs_the_otel_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings.from_dict({"replicas": ONE, "tracing": {"enabled": True}})
    monkeypatch.setattr("router.settings._otel_installed", lambda: False)
    with pytest.raises(SettingsError, match=r"tracing.enabled: true needs the otel extra"):
        s.check_runnable()
    Settings.from_dict({"replicas": ONE}).check_runnable()  # off: the extra is not needed


def test_peers_defaults_and_a_full_section() -> None:
    p = Settings.from_dict({}).routing.peers
    assert (p.enabled, p.host, p.port, p.bind, p.endpoints, p.dns) == \
        (False, "127.0.0.1", 5570, None, (), None)
    assert (p.dns_interval, p.heartbeat, p.timeout, p.ttl) == (5.0, 1.0, 5.0, 30.0)
    s = Settings.from_dict({"replicas": ONE, "workers": 2, "routing": {"peers": {
        "enabled": True, "host": "0.0.0.0", "port": 6000, "endpoints": ["tcp://10.0.0.2:6000",
                                                                         "ipc:///run/p.sock"],
        "dns": "router-peers.default.svc", "dns_interval": 2, "heartbeat": 0.5, "timeout": 3,
        "ttl": 20}}})
    p = s.routing.peers
    assert p.endpoints == ("tcp://10.0.0.2:6000", "ipc:///run/p.sock") and p.timeout == 3.0
    assert Settings.from_dict(json.loads(s.to_json())) == s  # reaches uvicorn workers intact


@pytest.mark.parametrize(("workers", "peers", "shared"), [
    (1, {}, False),                                  # one worker: nobody to share with
    (2, {}, True),                                   # the default for --workers N
    (4, {"siblings": False}, False),                 # turned off
    (2, {"enabled": True, "port": 6000}, False),     # an explicit peer configuration wins
])
def test_workers_share_by_default(workers: int, peers: dict[str, Any], shared: bool) -> None:
    s = Settings.from_dict({"replicas": ONE, "workers": workers, "routing": {"peers": peers}})
    assert s.workers_share is shared
    assert Settings.from_dict(json.loads(s.to_json())).workers_share is shared  # in the workers


def test_peers_need_the_kv_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings.from_dict({"replicas": ONE, "routing": {"peers": {"enabled": True}}})
    monkeypatch.setattr("router.settings.kv_installed", lambda: False)
    with pytest.raises(SettingsError, match=r"routing.peers.enabled: true needs the kv extra"):
        s.check_runnable()
