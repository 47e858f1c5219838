"""The rendered config: `nginx -t`, the settings mapping, the committed example, validation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from router.nginx_config import TEMPLATE_PATH, NginxOptions, render, render_config
from router.settings import Settings, load_settings
from tests.nginx.harness import check_config

NGINX_DIR = Path(__file__).resolve().parents[2] / "nginx"
REPLICAS = [("r1", "http://127.0.0.1:8102", 2), ("r0", "http://127.0.0.1:8101", 1),
            ("r2", "http://[::1]:8103", 1)]


def directives(conf: str, name: str) -> list[str]:
    """Arguments of every `name ...;` directive, comments stripped."""
    text = re.sub(r"#[^\n]*", "", conf)
    return [m.group(1).strip() for m in re.finditer(rf"(?m)^\s*{re.escape(name)}\s+([^;]*);", text)]


def wrap_snippet(snippet: str, prefix: Path) -> str:
    """A minimal main nginx.conf including a conf.d snippet, as a distribution's nginx.conf does."""
    (prefix / "conf.d").mkdir(parents=True, exist_ok=True)
    (prefix / "conf.d" / "prefix-router.conf").write_text(snippet)
    return ("pid nginx.pid;\nevents {}\nhttp {\n    client_body_temp_path client_body_temp;\n"
            "    proxy_temp_path proxy_temp;\n    include conf.d/*.conf;\n}\n")


@pytest.mark.nginx
def test_standalone_config_passes_nginx_t(tmp_path: Path) -> None:
    conf = render_config(REPLICAS, NginxOptions(listen="127.0.0.1:18080", standalone=True))
    result = check_config(tmp_path, conf)
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


@pytest.mark.nginx
def test_conf_d_snippet_passes_nginx_t_inside_an_http_block(tmp_path: Path) -> None:
    snippet = render_config(REPLICAS, NginxOptions(access_log=str(tmp_path / "access.log")))
    assert not re.search(r"(?m)^\s*(http|events)\s*\{", re.sub(r"#[^\n]*", "", snippet))
    result = check_config(tmp_path, wrap_snippet(snippet, tmp_path))
    assert result.returncode == 0, result.stderr


@pytest.mark.nginx
def test_committed_example_is_current_and_passes_nginx_t(tmp_path: Path) -> None:
    example = (NGINX_DIR / "example-4-replicas.conf").read_text()
    assert example == render(load_settings(NGINX_DIR / "example-router.yaml")), \
        "re-render: prefix-router nginx-config --config nginx/example-router.yaml"
    testable = example.replace("/var/log/nginx/prefix-router.access.log", str(tmp_path / "a.log"))
    result = check_config(tmp_path, wrap_snippet(testable, tmp_path))
    assert result.returncode == 0, result.stderr


def test_upstream_block_is_the_consistent_ring_with_keepalive_after_hash() -> None:
    conf = render_config(REPLICAS)
    upstream = conf[conf.index("upstream prefix_router {"):]
    upstream = upstream[: upstream.index("\n}\n")]
    assert directives(upstream, "hash") == ["$prefix_key consistent"]
    # keepalive wraps the balancer defined before it, so it must come after `hash`
    assert upstream.index("hash $prefix_key") < upstream.index("keepalive 64;")
    # sorted by name (the router's ring order), weights and address_of() addresses
    assert directives(upstream, "server") == [
        "127.0.0.1:8101 weight=1 max_fails=3 fail_timeout=30s",
        "127.0.0.1:8102 weight=2 max_fails=3 fail_timeout=30s",
        "[::1]:8103 weight=1 max_fails=3 fail_timeout=30s",
    ]


def test_location_streams_and_retries_only_safely() -> None:
    conf = render_config(REPLICAS)
    location = conf[conf.index("location /v1/ {"):]
    location = location[: location.index("\n    }\n")]
    assert directives(location, "proxy_buffering") == ["off"]
    assert directives(location, "proxy_cache") == ["off"]
    assert directives(location, "proxy_http_version") == ["1.1"]
    assert 'Connection ""' in directives(location, "proxy_set_header")
    assert directives(location, "proxy_next_upstream") == ["error timeout"]  # no non_idempotent
    assert "X-Accel-Buffering no always" in directives(location, "add_header")
    assert "X-Upstream-Addr $upstream_addr always" in directives(location, "add_header")
    assert directives(conf, "client_max_body_size") == [str(16 * 1024 * 1024)]
    # the keyless fallback: no header -> per-request random key
    assert re.search(r'map \$http_x_prefix_hash \$prefix_key \{\s*""\s+\$request_id;', conf)


def test_render_maps_router_settings() -> None:
    settings = Settings.from_dict({
        "replicas": [{"name": "a", "url": "https://10.1.0.1", "weight": 3},
                     {"name": "b", "url": "https://10.1.0.2:9000"}],
        "routing": {"key_header": "X-My-Key"},
        "health": {"eject_after": 5, "readmit_backoff_max": 12.5},
        "proxy": {"connect_timeout": 1.5, "first_byte_timeout": 120, "idle_timeout": 600,
                  "max_attempts": 2, "max_body_bytes": "1MiB", "replica_header": False},
    })
    conf = render(settings, listen="0.0.0.0:9443")
    assert directives(conf, "server")[:2] == [
        "10.1.0.1:443 weight=3 max_fails=5 fail_timeout=12500ms",  # scheme's port made explicit
        "10.1.0.2:9000 weight=1 max_fails=5 fail_timeout=12500ms",
    ]
    assert "map $http_x_my_key $prefix_key {" in conf
    assert directives(conf, "proxy_pass") == ["https://prefix_router"]
    assert directives(conf, "proxy_connect_timeout") == ["1500ms"]
    assert directives(conf, "proxy_read_timeout") == ["600s"]  # max(first byte, idle)
    assert directives(conf, "proxy_next_upstream_tries") == ["2"]
    assert directives(conf, "client_max_body_size") == ["1048576"]
    assert directives(conf, "listen") == ["0.0.0.0:9443"]
    assert "x-prefix-router-replica" not in conf


def test_render_needs_static_replicas() -> None:
    settings = Settings.from_dict({"discovery": {"type": "dns", "dns": {"name": "vllm.svc"}}})
    with pytest.raises(ValueError, match=r"discovery\.type"):
        render(settings)


@pytest.mark.parametrize(("replicas", "options", "message"), [
    ([], NginxOptions(), "at least one"),  # nothing to route to
    ([("r0; evil", "http://h:1", 1)], NginxOptions(), "replica name"),  # no directive injection
    ([("r0", "http://h:1/path", 1)], NginxOptions(), "url"),  # a path cannot be in `server`
    ([("r0", "ftp://h:1", 1)], NginxOptions(), "url"),  # http(s) only
    ([("r0", "http://h:1", 0)], NginxOptions(), "weight"),  # nginx rejects weight=0
    ([("a", "http://h:1", 1), ("b", "https://g:1", 1)], NginxOptions(), "mix"),
    ([("a", "http://h:1", 1), ("b", "http://h:1", 1)], NginxOptions(), "duplicate"),
    ([("r0", "http://h:1", 1)], NginxOptions(listen="80; include /x"), "listen"),
    ([("r0", "http://h:1", 1)], NginxOptions(key_header="X_Bad Header"), "key_header"),
    ([("r0", "http://h:1", 1)], NginxOptions(read_timeout=0), "read_timeout"),
])
def test_invalid_input_is_rejected(replicas: list[tuple[str, str, int]], options: NginxOptions,
                                   message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render_config(replicas, options)


def test_template_ships_in_the_package_and_nginx_dir_points_at_it() -> None:
    assert TEMPLATE_PATH.is_file()
    assert TEMPLATE_PATH.parent.parent.name == "router"  # package data: in the wheel too
    assert (NGINX_DIR / "prefix-router.conf.j2").resolve() == TEMPLATE_PATH
