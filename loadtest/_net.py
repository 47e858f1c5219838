"""Loopback helpers shared by the harness's process launchers (fleet, setups, vllm_fleet)."""

from __future__ import annotations

import random
import socket
import urllib.error
import urllib.request

_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free on ``host`` right now (another process may still take it),
    and never one this process was handed before: the OS can give a port it just reported free
    out again, so a fleet picking its ports one by one once got two replicas on one port."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no new free port on {host} in 1000 tries")


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def quiet_port(host: str = "127.0.0.1", rng: random.Random | None = None, n: int = 1) -> int:
    """A free TCP port *below* the kernel's ephemeral range, never handed out before; with
    ``n`` > 1 the first of ``n`` consecutive such ports (all free, all handed out by this call).

    For a socket bound long after the port is chosen (a vLLM replica binds its KV-event sockets a
    minute into its start-up), or for a range a server walks itself (peer workers bind port,
    port + 1, ...): a port from the ephemeral range, as `free_port` gives, can meanwhile be taken
    by any outgoing connection on the machine; one below it only by another explicit bind."""
    if n < 1:
        raise ValueError(f"n: expected at least 1 port, got {n}")
    low, _ = _ephemeral_range()
    # a host whose ephemeral range starts too low to leave room: anywhere (then only the bind
    # check protects the ports, as for `free_port`)
    top = low - n + 1 if low - n + 1 > 10000 + 1000 else 65536 - n
    rng = rng or random.Random()
    for _ in range(1000):
        port = rng.randrange(10000, top)
        ports = range(port, port + n)
        if any(p in _handed_out for p in ports) or not all(_bindable(host, p) for p in ports):
            continue
        _handed_out.update(ports)
        return port
    raise RuntimeError(f"no {n} free consecutive ports in [10000, {top + n - 1}] on {host} "
                       "in 1000 tries")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def http_get(url: str, timeout: float = 1.0) -> tuple[int, bytes] | None:
    """(status, body) of a GET; an error status has an empty body; None if nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except (OSError, urllib.error.URLError):
        return None


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """Whether a GET of ``url`` answers 200 (a readiness probe)."""
    got = http_get(url, timeout)
    return got is not None and got[0] == 200
