"""EndpointSlice -> Endpoint conversion and merging (pure; discovery.k8s.io/v1 semantics)."""

from __future__ import annotations

from typing import Any

import pytest

from router.discovery import Endpoint
from router.discovery.endpointslices import merge_slices, select_port, slice_endpoints


def ep(addr: str, pod: str | None = None, hostname: str | None = None, **cond: bool) -> dict:
    out: dict[str, Any] = {"addresses": [addr], "conditions": cond}
    if pod:
        out["targetRef"] = {"kind": "Pod", "name": pod}
    if hostname:
        out["hostname"] = hostname
    return out


def sl(*endpoints: dict, ports: list | None = None, family: str = "IPv4") -> dict:
    return {"addressType": family, "endpoints": list(endpoints),
            "ports": ports if ports is not None else [{"name": "http", "port": 8000}]}


@pytest.mark.parametrize(("ports", "want"), [
    ([{"name": "http", "port": 80}, {"name": "metrics", "port": 9}], 80),  # by name
    ([{"name": "", "port": 81}], 81),            # a single unnamed port is used
    ([{"name": "grpc", "port": 82}], 82),        # a single port is used whatever its name
    ([{"name": "a", "port": 1}, {"name": "b", "port": 2}], None),  # ambiguous: nothing
    ([], None),                                  # no ports (Service without selector ports)
    (None, None),
])
def test_select_port(ports: list | None, want: int | None) -> None:
    assert select_port(ports, "http") == want


@pytest.mark.parametrize(("endpoint", "want"), [
    # identity is the pod name; conditions unset mean ready, not terminating
    (ep("10.0.0.1", pod="vllm-0"), Endpoint("vllm-0", "http://10.0.0.1:8000")),
    (ep("10.0.0.1", pod="vllm-0", ready=False), Endpoint("vllm-0", "http://10.0.0.1:8000",
                                                         ready=False)),
    # a terminating pod: kept, draining
    (ep("10.0.0.1", pod="vllm-0", ready=False, serving=True, terminating=True),
     Endpoint("vllm-0", "http://10.0.0.1:8000", ready=False, terminating=True)),
    # no targetRef: hostname, then the address
    (ep("10.0.0.1", hostname="vllm-0"), Endpoint("vllm-0", "http://10.0.0.1:8000")),
    (ep("10.0.0.1"), Endpoint("10.0.0.1", "http://10.0.0.1:8000")),
    (ep("fd00::1", pod="v6"), Endpoint("v6", "http://[fd00::1]:8000")),
    ({"addresses": [], "targetRef": {"name": "x"}}, None),  # no address: skipped
])
def test_slice_endpoints(endpoint: dict, want: Endpoint | None) -> None:
    assert slice_endpoints(sl(endpoint), "http", "http") == ([want] if want else [])


def test_merge_prefers_ready_then_ipv4_then_slice_name() -> None:
    slices = {
        "b-v4": sl(ep("10.0.0.1", pod="p0", ready=False), ep("10.0.0.2", pod="p1")),
        "a-v6": sl(ep("fd00::1", pod="p0"), ep("fd00::2", pod="p1"), family="IPv6"),
        "c-v4": sl(ep("10.0.0.9", pod="p1")),
    }
    assert merge_slices(slices, "http", "https") == [
        Endpoint("p0", "https://[fd00::1]:8000"),   # the only ready copy
        Endpoint("p1", "https://10.0.0.2:8000"),    # IPv4 beats IPv6, then slice name b < c
    ]
