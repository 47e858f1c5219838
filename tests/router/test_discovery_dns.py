"""DNS discovery with an injected resolver: names, change detection, failure policy."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from router.discovery import Backoff, DnsDiscovery, Endpoint
from tests.deploy.discovery_runner import DiscoveryRunner


class FakeDns:
    def __init__(self, answers: list[str]) -> None:
        self.answers: list[str] | OSError = answers
        self.ptr: dict[str, str] = {}
        self.lookups = 0
        self.ptr_lookups = 0

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        self.lookups += 1
        await asyncio.sleep(0)
        if isinstance(self.answers, OSError):
            raise self.answers
        return list(self.answers)

    async def reverse(self, address: str) -> str | None:
        self.ptr_lookups += 1
        return self.ptr.get(address)


def run_poll(d: DnsDiscovery) -> list[Endpoint]:
    return asyncio.run(d.poll())


def test_names_from_ptr_first_label_else_address() -> None:
    dns = FakeDns(["10.0.0.2", "10.0.0.1", "fd00::1", "10.0.0.1"])
    dns.ptr = {"10.0.0.1": "vllm-0.vllm-headless.ns.svc.cluster.local.",
               "fd00::1": "vllm-0.vllm-headless.ns.svc.cluster.local."}
    d = DnsDiscovery("vllm-headless", 8000, "http", 1.0, resolver=dns.resolve, reverse=dns.reverse)
    assert run_poll(d) == [
        Endpoint("10.0.0.2", "http://10.0.0.2:8000"),
        # dual stack: one replica, the lowest address
        Endpoint("vllm-0", "http://10.0.0.1:8000"),
    ]


def test_without_reverse_names_are_addresses_and_ipv6_is_bracketed() -> None:
    dns = FakeDns(["fd00::1"])
    d = DnsDiscovery("x", 9000, "https", 1.0, resolver=dns.resolve, reverse=None)
    assert run_poll(d) == [Endpoint("fd00::1", "https://[fd00::1]:9000")]


def test_ptr_answers_are_cached_per_address() -> None:
    dns = FakeDns(["10.0.0.1", "10.0.0.2"])

    async def three_polls(d: DnsDiscovery) -> None:
        for _ in range(3):
            await d.poll()

    d = DnsDiscovery("x", 8000, resolver=dns.resolve, reverse=dns.reverse)
    asyncio.run(three_polls(d))
    assert dns.ptr_lookups == 2


def test_publishes_changes_and_keeps_membership_on_failure() -> None:
    dns = FakeDns(["10.0.0.1", "10.0.0.2"])
    d = DnsDiscovery("x", 8000, "http", 0.01, resolver=dns.resolve, reverse=None)
    with DiscoveryRunner(d) as r:
        r.wait_for(lambda eps: len(eps) == 2)
        dns.answers = ["10.0.0.1", "10.0.0.3"]
        r.wait_for(lambda eps: [e.name for e in eps] == ["10.0.0.1", "10.0.0.3"])
        n = len(r.published)
        dns.answers = OSError("SERVFAIL")
        before = dns.lookups
        while dns.lookups < before + 3:
            r.wait_for(lambda eps: True)
        assert len(r.published) == n  # the outage published nothing: fleet kept
        dns.answers = ["10.0.0.3"]
        r.wait_for(lambda eps: [e.name for e in eps] == ["10.0.0.3"])
    # unchanged answers are not re-published
    assert all(a != b for a, b in zip(r.published, r.published[1:], strict=False))


def test_first_lookup_failing_publishes_empty_once() -> None:
    dns = FakeDns([])
    dns.answers = OSError("NXDOMAIN")
    d = DnsDiscovery("x", 8000, "http", 0.01, resolver=dns.resolve, reverse=None)
    with DiscoveryRunner(d) as r:
        r.wait_for(lambda eps: eps == [])
        while dns.lookups < 4:
            r.wait_for(lambda eps: True)
    assert r.published == [[]]


def test_backoff_is_capped_jittered_and_resets() -> None:
    b = Backoff(base=1.0, cap=8.0, rng=lambda: 1.0)
    assert [b.next() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    b.reset()
    low = Backoff(base=1.0, cap=8.0, rng=lambda: 0.0)
    assert [low.next() for _ in range(3)] == [0.5, 1.0, 2.0]  # never below half
    assert b.next() == 1.0
