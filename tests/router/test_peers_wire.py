"""router.peers.wire: every event round-trips; anything else is a WireError naming the problem."""

from __future__ import annotations

import msgpack
import pytest

from router.chunks import Chunks
from router.metrics import _PEER_KINDS
from router.peers.state import KINDS, PeerEvent
from router.peers.wire import VERSION, WireError, decode, encode

EXACT = Chunks((7, -(2**63), 2**63 - 1), (16, 32, 48), 50)  # Python hash(): signed
CHUNKS = Chunks((1, 2, 2**64 - 1), (256, 512, 700), 700, EXACT)  # xxh3_64: unsigned


@pytest.mark.parametrize("event", [
    # a precise start: approximate chunks, exact block keys (a 64-bit hash at the top of range)
    PeerEvent("start", "pod-a-12-ab12cd", 5, "r1", 1700000000.25, CHUNKS, 650.0, True, True),
    # an approximate start (no exact keys), not streamed, a later turn
    PeerEvent("start", "p", 6, "r0", 1.0, CHUNKS._replace(exact=None), 0.0, False, False),
    # a start of a non-cache_aware policy: no chunks at all
    PeerEvent("start", "p", 7, "r0", 1.0, Chunks((), (), 0), 0.0),
    PeerEvent("served", "p", 5, "r1", 2.0, status=200),
    PeerEvent("served", "p", 5, "r1", 2.0, status=503),
    PeerEvent("ended", "p", 5, "r1", 3.0),
    PeerEvent("hello", "p", 0, ts=4.0),
    # a replica name and peer id outside ASCII
    PeerEvent("ended", "pod-é", 9, "réplica", 3.0),
])
def test_events_round_trip(event: PeerEvent) -> None:
    assert decode(event.peer.encode(), encode(event)) == event


def test_the_metrics_know_every_kind() -> None:
    assert _PEER_KINDS == KINDS


def _payload(*fields: object) -> bytes:
    return msgpack.packb(list(fields), use_bin_type=True)


GOOD = [VERSION, 0, 1, "r0", 1.0, None, 0.0, False, False, 0]


def _with(i: int, v: object) -> bytes:
    f = list(GOOD)
    f[i] = v
    return _payload(*f)


@pytest.mark.parametrize(("payload", "message"), [
    (b"\xc1", "not msgpack"),  # a reserved msgpack byte
    (_payload(*GOOD) + b"\x00", "not msgpack"),  # trailing bytes
    (msgpack.packb({"kind": "start"}), "expected an array, got dict"),
    (_payload(), "expected an array"),
    (_with(0, 2), "version 2, this router speaks 1"),  # a newer peer
    (_payload(*GOOD[:9]), "expected 10 fields, got 9"),
    (_with(1, 4), "kind: expected 0..3, got 4"),
    (_with(1, True), "kind: expected 0..3, got True"),
    (_with(2, "1"), "rid: expected an integer"),
    (_with(3, 5), "replica: expected a string"),
    (_with(4, "now"), "ts: expected a number"),
    (_with(5, [b"\x00" * 8, b"", 1, None]), "chunks: 1 hashes but 0 token counts"),
    (_with(5, [b"\x00" * 7, b"", 1, None]), "chunks.hashes: expected bytes of 8-byte integers"),
    (_with(5, [[1], [2], 1, None]), "chunks.hashes: expected bytes"),
    (_with(5, [b"", b"", -1, None]), "chunks.total: expected an integer >= 0"),
    (_with(5, [b"", b"", 0, [b"", b"", 0, [b"", b"", 0, None]]]), "chunks.exact: nested"),
    (_with(5, "chunks"), "chunks: expected [hashes, tokens, total, exact]"),
    (_with(6, None), "prefill: expected a number"),
    (_with(7, 1), "stream, first: expected booleans"),
    (_with(9, "200"), "status: expected an integer"),
])
def test_malformed_payloads_are_wire_errors(payload: bytes, message: str) -> None:
    with pytest.raises(WireError) as err:
        decode(b"p", payload)
    assert message in str(err.value)


def test_a_peer_id_that_is_not_utf8_is_a_wire_error() -> None:
    with pytest.raises(WireError, match="UTF-8"):
        decode(b"\xff\xfe", _payload(*GOOD))


def test_an_integer_out_of_range_is_a_wire_error_not_a_crash() -> None:
    bad = PeerEvent("start", "p", 1, "r0", 1.0, Chunks((-1,), (16,), 16), 0.0)
    with pytest.raises(WireError, match="not 64-bit integers"):
        encode(bad)
