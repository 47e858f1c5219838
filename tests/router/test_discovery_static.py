"""Static discovery, `make_discovery` from real Settings, and the package's public API."""

from __future__ import annotations

import pytest

import router.discovery as discovery
from router.discovery import (
    DnsDiscovery,
    Endpoint,
    KubernetesDiscovery,
    StaticDiscovery,
    make_discovery,
)
from router.settings import Settings
from tests.deploy.discovery_runner import DiscoveryRunner


def test_public_api_is_pinned() -> None:
    assert discovery.__all__ == ["Backoff", "Discovery", "DnsDiscovery", "Endpoint",
                                 "KubernetesDiscovery", "Membership", "Publish",
                                 "StaticDiscovery", "make_discovery"]


def test_static_publishes_once_sorted_and_runs_until_cancelled() -> None:
    eps = [Endpoint("r1", "http://127.0.0.1:2"), Endpoint("r0", "http://127.0.0.1:1", weight=3)]
    with DiscoveryRunner(StaticDiscovery(eps)) as r:
        r.wait_for(lambda got: True)
    assert r.published == [sorted(eps, key=lambda e: e.name)]


def test_static_rejects_duplicate_names() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        StaticDiscovery([Endpoint("r0", "http://a:1"), Endpoint("r0", "http://b:1")])


def test_make_discovery_from_settings() -> None:
    static = make_discovery(Settings.from_dict({"replicas": [
        {"name": "r0", "url": "http://127.0.0.1:8101", "weight": 2}]}))
    assert isinstance(static, StaticDiscovery)
    assert static.endpoints == [Endpoint("r0", "http://127.0.0.1:8101", weight=2)]

    dns = make_discovery(Settings.from_dict({"discovery": {"type": "dns", "dns": {
        "name": "vllm-headless.ml.svc.cluster.local", "port": 8001, "interval": 2.5}}}))
    assert isinstance(dns, DnsDiscovery)
    assert (dns.name, dns.port, dns.scheme, dns.interval) == (
        "vllm-headless.ml.svc.cluster.local", 8001, "http", 2.5)

    k8s = make_discovery(Settings.from_dict({"discovery": {"type": "kubernetes", "kubernetes": {
        "namespace": "ml", "service": "vllm-headless", "port_name": "api", "scheme": "https"}}}))
    assert isinstance(k8s, KubernetesDiscovery)
    assert (k8s.namespace, k8s.service, k8s.port_name, k8s.scheme, k8s.kubeconfig) == (
        "ml", "vllm-headless", "api", "https", None)
    assert k8s.selector == "kubernetes.io/service-name=vllm-headless"


def test_default_settings_mean_an_empty_static_fleet() -> None:
    d = make_discovery(Settings())
    assert isinstance(d, StaticDiscovery) and d.endpoints == []
