"""Replica roles (prefill | decode | both): settings, every discovery source, replica state."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from router.discovery import DnsDiscovery, Endpoint, make_discovery
from router.discovery.endpointslices import ROLE_LABEL, merge_slices
from router.discovery.kubernetes import SliceState
from router.replicas import ReplicaSet
from router.roles import DEFAULT_ROLE, Role, role_of
from router.settings import Settings, SettingsError


def settings(*replicas: dict[str, Any], **extra: Any) -> Settings:
    return Settings.from_dict({"replicas": list(replicas), **extra})


def test_role_defaults_to_both_and_round_trips() -> None:
    s = settings({"name": "p", "url": "http://h:1", "role": "prefill"},
                 {"name": "d", "url": "http://h:2", "role": "decode"},
                 {"name": "x", "url": "http://h:3"})
    assert [r.role for r in s.replicas] == [Role.PREFILL, Role.DECODE, DEFAULT_ROLE]
    assert DEFAULT_ROLE is Role.BOTH
    assert Settings.from_dict(s.to_dict()) == s


@pytest.mark.parametrize(("entry", "message"), [
    ({"role": "prefil"}, "replicas[0].role: expected one of prefill | decode | both, got 'prefil'"),
    ({"role": None}, "replicas[0].role: expected one of prefill | decode | both, got None"),
    ({"role": 1}, "replicas[0].role: expected one of prefill | decode | both, got 1"),
])
def test_bad_role_names_the_key(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        settings({"name": "r0", "url": "http://h:1", **entry})
    assert str(err.value) == message


def test_role_of() -> None:
    assert [role_of(v) for v in ("prefill", "decode", "both", "Prefill", "", None, 3)] == \
        [Role.PREFILL, Role.DECODE, Role.BOTH, None, None, None, None]


def test_static_discovery_carries_the_role() -> None:
    s = settings({"name": "p", "url": "http://h:1", "role": "prefill"},
                 {"name": "d", "url": "http://h:2", "role": "decode"})
    d = make_discovery(s)
    assert [(e.name, e.role) for e in d.endpoints] == [  # type: ignore[attr-defined]
        ("p", Role.PREFILL), ("d", Role.DECODE)]


class RoleDns:
    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        return self.answers[host]


def test_dns_resolves_one_service_per_role() -> None:
    dns = RoleDns({"vllm": ["10.0.0.1"], "vllm-prefill": ["10.0.0.2", "10.0.0.4"],
                   "vllm-decode": ["10.0.0.3", "10.0.0.4"]})
    s = Settings.from_dict({"discovery": {"type": "dns", "dns": {
        "name": "vllm", "prefill": "vllm-prefill", "decode": "vllm-decode"}}})
    assert s.discovery.dns.names() == (("vllm", Role.BOTH), ("vllm-prefill", Role.PREFILL),
                                       ("vllm-decode", Role.DECODE))
    made = make_discovery(s)
    assert isinstance(made, DnsDiscovery)
    d = DnsDiscovery(made.name, 8000, "http", 1.0, resolver=dns.resolve, reverse=None,
                     role=made.names[0][1], more=made.names[1:])
    got = asyncio.run(d.poll())
    assert [(e.name, e.role) for e in got] == [
        ("10.0.0.1", Role.BOTH), ("10.0.0.2", Role.PREFILL), ("10.0.0.3", Role.DECODE),
        ("10.0.0.4", Role.BOTH)]  # listed by both role Services: serves both


def test_dns_with_only_role_services_is_valid() -> None:
    s = Settings.from_dict({"discovery": {"type": "dns", "dns": {
        "prefill": "p.svc", "decode": "d.svc"}}})
    made = make_discovery(s)
    assert isinstance(made, DnsDiscovery)
    assert made.names == (("p.svc", Role.PREFILL), ("d.svc", Role.DECODE))
    with pytest.raises(SettingsError, match=r"^discovery\.dns\.name: required"):
        Settings.from_dict({"discovery": {"type": "dns", "dns": {"port": 1}}})


def _slice(name: str, addr: str, role: str | None) -> dict[str, Any]:
    labels = {"kubernetes.io/service-name": name}
    if role is not None:
        labels[ROLE_LABEL] = role
    return {"metadata": {"name": name, "labels": labels}, "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8000}],
            "endpoints": [{"addresses": [addr], "targetRef": {"name": f"pod-{name}"}}]}


def test_endpointslice_role_label() -> None:
    slices = {"a": _slice("a", "10.0.0.1", "prefill"), "b": _slice("b", "10.0.0.2", "decode"),
              "c": _slice("c", "10.0.0.3", None), "d": _slice("d", "10.0.0.4", "typo")}
    assert [(e.name, e.role) for e in merge_slices(slices, "http", "http")] == [
        ("pod-a", Role.PREFILL), ("pod-b", Role.DECODE), ("pod-c", Role.BOTH),
        ("pod-d", Role.BOTH)]


def test_unknown_role_label_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    state = SliceState("http", "http")
    state.replace([_slice("d", "10.0.0.4", "typo")], "1")
    state.apply({"type": "MODIFIED", "object": _slice("d", "10.0.0.4", "typo")})
    warnings = [r for r in caplog.records if ROLE_LABEL in r.getMessage()]
    assert len(warnings) == 1 and "'typo'" in warnings[0].getMessage()


def test_role_changes_keep_the_state_and_the_ring() -> None:
    rs = ReplicaSet([Endpoint("a", "http://h:1"), Endpoint("b", "http://h:2")])
    state, ring = rs.get("a"), rs.ring
    assert state is not None
    state.in_flight = 3
    rebuilt = rs.update_membership([Endpoint("a", "http://h:1", role=Role.DECODE),
                                    Endpoint("b", "http://h:2", role=Role.PREFILL)])
    assert not rebuilt and rs.ring is ring
    assert rs.get("a") is state and state.in_flight == 3
    assert [(s.name, s.role) for s in rs.states()] == [("a", Role.DECODE), ("b", Role.PREFILL)]
    rs.update_membership([Endpoint("a", "http://h:1"), Endpoint("b", "http://h:2")])
    assert [s.role for s in rs.states()] == [Role.BOTH, Role.BOTH]
