"""EndpointSlices -> endpoints: the pure half of Kubernetes discovery.

A Service's endpoints are spread over several EndpointSlices (label
`kubernetes.io/service-name=<service>`): up to 100 endpoints per slice by default, and one slice
per address family for dual-stack Services. `merge_slices` joins them into one membership:

* port: the slice port named `port_name`; a slice with a single port uses it whatever its name
  (Services with one unnamed port produce `name: ""`); a slice with neither contributes nothing.
* identity: `targetRef.name` (the pod name: stable across StatefulSet restarts), else `hostname`,
  else the first address.
* conditions (discovery.k8s.io/v1 semantics): `ready` unset means ready; `terminating` unset means
  not terminating. A terminating endpoint is published with terminating=True (draining).
* a name present in several slices (dual stack, or a pod mid-move between slices) appears once:
  the ready, non-terminating copy wins, then IPv4 over other families, then the lowest slice name.
* models: a slice carrying the label `MODEL_LABEL` (``prefix-router.io/model``; Kubernetes copies
  a Service's labels onto its EndpointSlices) gives its endpoints that model (`Endpoint.models`,
  fixed: `router.models`); without it the router learns the model from each replica.
* role: a slice carrying the label `ROLE_LABEL` (``prefix-router.io/role``: prefill | decode |
  both; one Service per role) gives its endpoints that role (`router.roles`); without it, or
  with another value (`SliceState` warns once), they are ``both``.

Cost: O(total endpoints · log) per merge; merges run once per watch event (a handful of slices).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from router.discovery.base import Endpoint, url_for
from router.roles import DEFAULT_ROLE, ROLE_LABEL, role_of

__all__ = ["MODEL_LABEL", "ROLE_LABEL", "SERVICE_NAME_LABEL", "endpoint_name", "merge_slices", "select_port",
           "slice_endpoints"]

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MODEL_LABEL = "prefix-router.io/model"


def select_port(ports: Iterable[Mapping[str, Any]] | None, port_name: str) -> int | None:
    candidates = [p for p in ports or () if p.get("port") is not None]
    for p in candidates:
        if (p.get("name") or "") == port_name:
            return int(p["port"])
    return int(candidates[0]["port"]) if len(candidates) == 1 else None


def endpoint_name(ep: Mapping[str, Any]) -> str | None:
    ref = ep.get("targetRef") or {}
    addresses = ep.get("addresses") or []
    name = ref.get("name") or ep.get("hostname") or (addresses[0] if addresses else None)
    return str(name) if name else None


def slice_endpoints(obj: Mapping[str, Any], port_name: str, scheme: str) -> list[Endpoint]:
    port = select_port(obj.get("ports"), port_name)
    if port is None:
        return []
    labels = (obj.get("metadata") or {}).get("labels") or {}
    model = labels.get(MODEL_LABEL)
    models = (str(model),) if model else None
    role = role_of(labels.get(ROLE_LABEL)) or DEFAULT_ROLE
    out = []
    for ep in obj.get("endpoints") or ():
        addresses = ep.get("addresses") or []
        name = endpoint_name(ep)
        if not addresses or not name:
            continue
        cond = ep.get("conditions") or {}
        out.append(Endpoint(name=name, url=url_for(scheme, str(addresses[0]), port),
                            ready=cond.get("ready") is not False,
                            terminating=cond.get("terminating") is True, models=models,
                            role=role))
    return out


def merge_slices(slices: Mapping[str, Mapping[str, Any]], port_name: str,
                 scheme: str) -> list[Endpoint]:
    best: dict[str, tuple[tuple[bool, bool, str], Endpoint]] = {}
    for slice_name, obj in slices.items():
        ipv4 = obj.get("addressType", "IPv4") == "IPv4"
        for ep in slice_endpoints(obj, port_name, scheme):
            rank = (not ep.ready or ep.terminating, not ipv4, slice_name)
            if ep.name not in best or rank < best[ep.name][0]:
                best[ep.name] = (rank, ep)
    return sorted((ep for _, ep in best.values()), key=lambda e: e.name)
