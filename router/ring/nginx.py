"""nginx's ``hash $key consistent;`` ring, reproduced bit for bit (ngx_http_upstream_hash_module).

Ring construction (``ngx_http_upstream_init_chash``), per ``server`` in config order:

- the server string as written in the ``server`` directive (here ``RingMember.address``, i.e.
  ``router.replicas.address_of(url)``, e.g. ``10.0.0.7:8000``) is split into host and port:
  ``unix:PATH`` -> host ``PATH``, no port; otherwise the port is the run of digits after the
  *last* ``:`` (``[::1]:80`` -> ``[::1]``, ``80``); without such a suffix it is all host, no port;
- ``weight * 160`` points; point ``j`` hashes ``crc32(host + b"\0" + port + prev)`` where
  ``prev`` is point ``j-1``'s hash as 4 little-endian bytes (zero for ``j = 0``). nginx
  writes those bytes explicitly on big-endian hosts, so the ring is the same on every CPU.
  CRC32 is the IEEE/zlib one (init ``0xffffffff``, final xor), i.e. :func:`zlib.crc32`.
- all points are sorted by hash; of several points with the *same* hash only the first in
  sorted order is kept. nginx sorts with libc ``qsort`` (not guaranteed stable); we keep the
  point of the server listed first, which is what a stable sort gives. Two servers share a hash
  with probability about P^2 / 2^33 for P points (2e-4 for 1,280), and then one arc differs.

Lookup (``ngx_http_upstream_init_chash_peer``): ``h = crc32(key bytes)``; the home point is the
first point with hash ``>= h`` (binary search), index ``P`` wrapping to ``0``. nginx hashes the
header's raw bytes, and ASGI servers hand the router header values decoded as latin-1, so a key
is encoded back as latin-1 (the wire bytes); only a key that cannot be latin-1 (never one read
from a header) is hashed as UTF-8. Keys from ``router.client.hash_key`` are ASCII either way.

Walking on (``ngx_http_upstream_get_chash_peer``): nginx moves one *point* at a time from the
home point, skipping points whose server was already tried for this request, is ``down``, or is
out for ``fail_timeout`` after ``max_fails`` failures (or is at ``max_conns``). A retry
(``proxy_next_upstream``) resumes from the point where the previous attempt stopped. So the
servers nginx tries are exactly :meth:`NginxRing.walk` minus the unavailable ones, with one
difference: since 1.13.6 nginx gives up after 20 skipped points per request and falls back to
weighted round-robin. :meth:`NginxRing.nginx_pick` models that cap exactly (``None`` where nginx
goes round-robin); :meth:`walk` is uncapped. With 160 points per weight a run of more than 20
skipped points is rare unless much of the fleet is unavailable or one weight dwarfs the rest.
nginx >= 1.17.1 (ours: 1.22) also goes round-robin when the key is *empty* or there is a single
server; the generated config never produces an empty key (see ``router.nginx_config``).

Cost: build O(P log P) for P = 160 * total weight points (~1.5 ms for 8 servers); ``lookup`` is
one crc32 plus O(log P); ``walk`` enumerates N members in about N * H(N) point steps, lazily.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Container, Iterator, Sequence

from router.ring.base import RingMember, distinct_owners

__all__ = ["NGINX_MAX_SKIPS", "POINTS_PER_WEIGHT", "NginxRing", "key_bytes", "split_server"]

POINTS_PER_WEIGHT = 160
NGINX_MAX_SKIPS = 20  # points nginx steps over per request before falling back to round-robin


def split_server(server: str) -> tuple[bytes, bytes]:
    """(host, port) bytes exactly as nginx splits a ``server`` string before hashing it."""
    raw = server.encode()
    if raw[:5].lower() == b"unix:":
        return raw[5:], b""
    digits = len(raw)
    while digits > 0 and raw[digits - 1 : digits].isdigit():
        digits -= 1
    if digits > 0 and raw[digits - 1 : digits] == b":":
        return raw[: digits - 1], raw[digits:]
    return raw, b""


def key_bytes(key: str) -> bytes:
    """The bytes nginx hashed for a key the router holds as ``key`` (see module docstring)."""
    try:
        return key.encode("latin-1")
    except UnicodeEncodeError:
        return key.encode()


def server_points(server: str, weight: int) -> list[int]:
    """The ``160 * weight`` point hashes nginx derives for one server, in generation order."""
    host, port = split_server(server)
    base = zlib.crc32(host + b"\0" + port)
    points: list[int] = []
    prev = 0
    for _ in range(POINTS_PER_WEIGHT * weight):
        # crc32 is resumable: crc32(b, crc32(a)) == crc32(a + b)
        prev = zlib.crc32(prev.to_bytes(4, "little"), base)
        points.append(prev)
    return points


class NginxRing:
    """The consistent ring nginx builds for an upstream whose servers are ``members``, in order.

    Member order matters only for equal-hash ties (see module docstring): ``ReplicaSet`` passes
    members sorted by name and ``router.nginx_config`` lists servers in that same order.
    """

    def __init__(self, members: Sequence[RingMember]) -> None:
        self.members = tuple(members)
        names = [m.name for m in self.members]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate ring member names: {names}")
        servers = [m.address or m.name for m in self.members]
        if len(set(servers)) != len(servers):
            # nginx would merge their points by server string; the router could not tell them apart
            raise ValueError(f"duplicate ring member addresses: {servers}")
        tagged = sorted(
            (h, index)
            for index, (server, m) in enumerate(zip(servers, self.members, strict=True))
            for h in server_points(server, m.weight)
        )
        self._hashes: list[int] = []
        self._owners: list[int] = []
        for h, owner in tagged:
            if not self._hashes or self._hashes[-1] != h:
                self._hashes.append(h)
                self._owners.append(owner)
        self._names = names

    def __len__(self) -> int:
        """Number of distinct points on the ring."""
        return len(self._hashes)

    def home_point(self, key: str) -> int:
        """Index of the key's home point: first point with hash >= crc32(key), wrapping."""
        if not self._hashes:
            raise LookupError("empty ring")
        index = bisect.bisect_left(self._hashes, zlib.crc32(key_bytes(key)))
        return index % len(self._hashes)

    def lookup(self, key: str) -> str:
        """The member nginx sends ``key`` to when every server is up."""
        return self._names[self._owners[self.home_point(key)]]

    def home(self, key: str) -> str | None:
        return self.lookup(key) if self._hashes else None

    def walk(self, key: str) -> Iterator[str]:
        """Distinct member names in ring order from the key's home point (uncapped)."""
        if not self._hashes:
            return
        yield from distinct_owners(self._owners, self._names, self.home_point(key))

    def nginx_pick(self, key: str, unavailable: Container[str] = ()) -> str | None:
        """The server nginx 1.22 picks for ``key`` when the ``unavailable`` members are tried,
        down or failed: the first other member along the ring within ``NGINX_MAX_SKIPS`` skipped
        points, else ``None`` (nginx then falls back to weighted round-robin)."""
        if len(self._names) < 2:
            # a single server: nginx goes straight to round-robin, which can only pick it
            return next((n for n in self._names if n not in unavailable), None)
        start = self.home_point(key)
        total = len(self._hashes)
        for skips in range(NGINX_MAX_SKIPS + 1):
            name = self._names[self._owners[(start + skips) % total]]
            if name not in unavailable:
                return name
        return None

    def __repr__(self) -> str:
        return f"NginxRing({len(self.members)} members, {len(self._hashes)} points)"
