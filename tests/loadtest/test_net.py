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


def test_quiet_port_is_below_the_ephemeral_range_bindable_and_new() -> None:
    import random
    import socket

    from loadtest._net import _ephemeral_range, quiet_port

    low, _ = _ephemeral_range()
    rng = random.Random(5)
    ports = [quiet_port(rng=rng) for _ in range(20)]
    assert len(set(ports)) == 20 and all(10000 <= p < low for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))
