"""loadtest._net: loopback helpers."""

from __future__ import annotations

import socket

from loadtest._net import free_port


def test_free_port_never_repeats_and_is_bindable() -> None:
    # The kernel may report a port it just reported free again; a fleet picking its ports one by
    # one then gets two replicas on one port. 300 picks stay distinct, and each can be bound.
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))
