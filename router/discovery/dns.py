"""DNS discovery: poll a headless Service's A/AAAA records every `interval` seconds.

Each poll resolves `name` (both address families, de-duplicated) and, when a reverse resolver is
set, names every address by the first label of its PTR record: for a StatefulSet behind a headless
Service that is the pod name (`vllm-0.vllm-headless.ns.svc.cluster.local` -> `vllm-0`), so the ring
survives pod restarts that change the IP. Without a PTR record the name is the address itself.
PTR answers are cached per address while the address stays in the answer set.

Roles (prefill/decode disaggregation, `router.roles`): the addresses of `name` get `role` (both,
unless the settings named only a role's Service); each `(name, role)` of `more` - one headless
Service per role, ``discovery.dns.prefill`` / ``decode`` - is resolved in the same poll and its
addresses get that role. A replica found under two roles serves both.

Failure policy: a failed resolution (of any of the names) keeps the last published membership (a DNS outage must not
empty the fleet; health checks eject dead replicas) and retries with capped backoff; before the
first success an empty membership is published once. Retries start at 0.5 s and back off up to
the poll interval. Cost per poll: one forward lookup plus one
PTR lookup per *new* address.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence

from router.discovery.base import Backoff, Endpoint, Membership, Publish, url_for
from router.roles import DEFAULT_ROLE, Role

__all__ = ["DnsDiscovery", "Resolver", "ReverseResolver", "resolve_addresses", "reverse_name"]

log = logging.getLogger("router.discovery")

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
ReverseResolver = Callable[[str], Awaitable[str | None]]


async def resolve_addresses(host: str, port: int) -> list[str]:
    """A and AAAA records of `host` via the system resolver (run in the default executor)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


async def reverse_name(address: str) -> str | None:
    try:
        host, _ = await asyncio.get_running_loop().getnameinfo((address, 0), socket.NI_NAMEREQD)
    except OSError:
        return None
    return host or None


class DnsDiscovery:
    def __init__(self, name: str, port: int, scheme: str = "http", interval: float = 5.0, *,
                 resolver: Resolver = resolve_addresses,
                 reverse: ReverseResolver | None = reverse_name, role: Role = DEFAULT_ROLE,
                 more: Sequence[tuple[str, Role]] = ()) -> None:
        self.name = name
        self.names: tuple[tuple[str, Role], ...] = ((name, role), *more)
        self.port = port
        self.scheme = scheme
        self.interval = interval
        self._resolve = resolver
        self._reverse = reverse
        self._ptr: dict[str, str] = {}

    async def poll(self) -> list[Endpoint]:
        roles: dict[str, Role] = {}
        for host, role in self.names:
            for address in await self._resolve(host, self.port):
                seen = roles.get(address)
                roles[address] = role if seen is None or seen is role else Role.BOTH
        addresses = sorted(roles)
        self._ptr = {a: n for a, n in self._ptr.items() if a in roles}
        for address in addresses:
            if address not in self._ptr:
                self._ptr[address] = await self._name_for(address)
        names: dict[str, str] = {}
        named: dict[str, Role] = {}
        for address in addresses:
            # two addresses of one pod (dual stack) share a PTR name: keep one, the lowest address
            n = self._ptr[address]
            names.setdefault(n, address)
            seen = named.get(n)
            named[n] = roles[address] if seen is None or seen is roles[address] else Role.BOTH
        return [Endpoint(name=n, url=url_for(self.scheme, names[n], self.port), role=named[n])
                for n in sorted(names)]

    async def _name_for(self, address: str) -> str:
        if self._reverse is None:
            return address
        ptr = await self._reverse(address)
        return ptr.rstrip(".").split(".", 1)[0] if ptr else address

    async def run(self, publish: Publish) -> None:
        membership = Membership(publish, "dns")
        # retry a failed lookup sooner than the poll interval, backing off up to it
        backoff = Backoff(base=min(0.5, self.interval), cap=self.interval)
        while True:
            try:
                endpoints = await self.poll()
            except (OSError, UnicodeError) as exc:
                if backoff.failures == 0:
                    log.warning("dns discovery: resolving %s failed (%s); keeping %s membership",
                                self.name, exc, "the last" if membership.published else "an empty")
                if not membership.published:
                    membership.update([])
                await asyncio.sleep(backoff.next())
                continue
            if backoff.failures:
                log.info("dns discovery: resolving %s works again", self.name)
                backoff.reset()
            membership.update(endpoints)
            await asyncio.sleep(self.interval)
