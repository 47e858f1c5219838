"""Check a running nginx against the router's NginxRing: same keys, same replicas?

    python scripts/capture_nginx_ring.py --config router.yaml --nginx http://127.0.0.1:8080 \
        [--keys 1000] [--path /v1/models] [--out placements.json]

Sends ``--keys`` cheap requests (``GET /v1/models`` by default, nothing is generated) through an
nginx rendered by ``prefix-router nginx-config`` from the same ``router.yaml``, each with its own
``X-Prefix-Hash``, reads the ``X-Upstream-Addr`` debug header, and compares the replica with
``NginxRing.lookup(key)``. Prints per-replica counts and mismatches; exit status 1 on any
mismatch. ``--out`` writes the captured ``{key: replica}`` table as JSON.
Cost: one keep-alive request per key.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
from collections import Counter
from urllib.parse import urlsplit

from router.replicas import address_of
from router.ring import RingMember
from router.ring.nginx import NginxRing
from router.settings import load_settings


def _addresses(url: str) -> set[str]:
    """``host:port`` plus the resolved ``ip:port`` forms nginx may report in $upstream_addr."""
    address = address_of(url)
    parts = urlsplit(url)
    port = address.rsplit(":", 1)[1]
    found = {address}
    try:
        for info in socket.getaddrinfo(parts.hostname, int(port), proto=socket.IPPROTO_TCP):
            ip = str(info[4][0])
            found.add(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}")
    except OSError:
        pass
    return found


def capture(nginx_url: str, keys: list[str], path: str, header: str) -> dict[str, str]:
    """{key: upstream address nginx used}."""
    parts = urlsplit(nginx_url)
    conn = (http.client.HTTPSConnection(parts.netloc, timeout=30) if parts.scheme == "https"
            else http.client.HTTPConnection(parts.netloc, timeout=30))
    out: dict[str, str] = {}
    try:
        for key in keys:
            conn.request("GET", path, headers={header: key})
            response = conn.getresponse()
            response.read()
            out[key] = response.headers.get("x-upstream-addr", f"<none: HTTP {response.status}>")
    finally:
        conn.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the router.yaml nginx was rendered from")
    parser.add_argument("--nginx", required=True,
                        help="base URL of nginx, e.g. http://127.0.0.1:8080")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--path", default="/v1/models")
    parser.add_argument("--out", help="write {key: replica} as JSON here")
    args = parser.parse_args(argv)

    settings = load_settings(args.config)
    ring = NginxRing([RingMember(r.name, r.weight, address_of(r.url)) for r in settings.replicas])
    by_address = {a: r.name for r in settings.replicas for a in _addresses(r.url)}
    keys = [f"capture-{i:06d}" for i in range(args.keys)]
    upstreams = capture(args.nginx, keys, args.path, settings.routing.key_header)
    table = {k: by_address.get(a, a) for k, a in upstreams.items()}
    expected = {k: ring.lookup(k) for k in table}
    mismatches = {k: (v, expected[k]) for k, v in table.items() if v != expected[k]}

    for name, count in sorted(Counter(table.values()).items()):
        print(f"{name:>24} {count:7d}")
    print(f"{len(keys)} keys, {len(mismatches)} placed differently from NginxRing")
    for key, (got, want) in list(mismatches.items())[:10]:
        print(f"  {key}: nginx -> {got}, NginxRing -> {want}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=1, sort_keys=True)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
