"""loadtest._net: loopback helpers."""

from __future__ import annotations

import socket

import pytest

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


def test_quiet_port_range_skips_a_range_with_a_taken_port() -> None:
    import random

    from loadtest._net import _ephemeral_range, quiet_port

    low, _ = _ephemeral_range()
    first = random.Random(11).randrange(10000, low - 2)  # the range the next call looks at first
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first + 2))  # its last port is taken
        base = quiet_port(rng=random.Random(11), n=3)
    assert base != first and first + 2 not in range(base, base + 3)
    assert 10000 <= base and base + 2 < low
    for port in range(base, base + 3):  # all free, and handed out: never given again
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert all(quiet_port(n=3) not in range(base - 2, base + 3) for _ in range(50))


def test_quiet_port_with_no_room_below_the_ephemeral_range(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    from loadtest import _net

    monkeypatch.setattr(_net, "_ephemeral_range", lambda: (1024, 65535))  # a widened range
    base = _net.quiet_port(rng=random.Random(3), n=2)
    assert 10000 <= base and base + 1 <= 65535
    with pytest.raises(ValueError, match="at least 1"):
        _net.quiet_port(n=0)
