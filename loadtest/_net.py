"""Loopback helpers shared by the harness's process launchers (fleet, setups, vllm_fleet)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free on ``host`` right now (another process may still take it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
