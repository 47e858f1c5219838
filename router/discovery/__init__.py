"""Replica discovery: static list, DNS (headless Service) or Kubernetes EndpointSlices.

`make_discovery(settings)` builds the source `settings.discovery.type` names; the app's lifespan
runs `await discovery.run(publish)` as a task and cancels it at shutdown.
"""

from __future__ import annotations

from typing import Any

from router.discovery.base import Backoff, Discovery, Endpoint, Membership, Publish
from router.discovery.dns import DnsDiscovery
from router.discovery.kubernetes import KubernetesDiscovery
from router.discovery.static import StaticDiscovery
from router.roles import DEFAULT_ROLE

__all__ = [
    "Backoff",
    "Discovery",
    "DnsDiscovery",
    "Endpoint",
    "KubernetesDiscovery",
    "Membership",
    "Publish",
    "StaticDiscovery",
    "make_discovery",
]


def make_discovery(settings: Any) -> Discovery:
    """The discovery source for a `router.settings.Settings` (fields as in docs/architecture.md)."""
    disc = getattr(settings, "discovery", None)
    kind = getattr(disc, "type", "static") or "static"
    if kind == "static":
        return StaticDiscovery(
            Endpoint(name=r.name, url=r.url, weight=getattr(r, "weight", 1),
                     models=getattr(r, "models", None), role=getattr(r, "role", DEFAULT_ROLE))
            for r in getattr(settings, "replicas", ()) or ())
    if kind == "dns":
        d = disc.dns  # type: ignore[union-attr]
        names = d.names()
        if not names:
            raise ValueError("discovery.dns.name: required when discovery.type is dns")
        first, role = names[0]
        return DnsDiscovery(first, d.port, d.scheme, d.interval, role=role, more=names[1:])
    if kind == "kubernetes":
        k = disc.kubernetes  # type: ignore[union-attr]
        return KubernetesDiscovery(k.namespace, k.service, k.port_name, k.scheme,
                                   kubeconfig=k.kubeconfig,
                                   label_selector=getattr(k, "selector", None))
    raise ValueError(f"discovery.type: expected one of static | dns | kubernetes, got {kind!r}")
