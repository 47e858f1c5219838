"""`PeerEvent` on the wire: one msgpack frame per event, versioned. Pure.

A message on a peer's PUB socket is two frames ``[peer, payload]``: ``peer`` is the publishing
process's id (UTF-8; a subscriber drops its own echoes by comparing this frame, before any
decoding) and ``payload`` is msgpack of a positional array::

    [VERSION, kind, rid, replica, ts, chunks, prefill, stream, first, status]

``kind`` is the index of the event's kind in `router.peers.state.KINDS`; ``chunks`` is nil or
``[hashes, tokens, total, exact]`` where ``hashes`` and ``tokens`` are raw bytes of 64-bit
little-endian integers (one ``bytes`` copy instead of one msgpack integer per chunk) and
``exact`` is nil or the same shape without its own ``exact``. The approximate chunk hashes are
unsigned (``xxh3_64``, `router.chunks`), the exact block keys signed (Python's ``hash`` chain,
`templates_audit.blocks`); token counts are unsigned. Only a ``start`` carries chunks,
prefill, stream and first; only a ``served`` its status; the others send the defaults.

Invariants: ``decode(peer, encode(e)) == e`` for every event whose integers fit those types
and whose ``peer`` is the frame's; ``encode`` raises `WireError` for any other. ``decode`` raises nothing but `WireError`: a different version, a
wrong type or length, bad msgpack or trailing bytes are all errors naming what is wrong (a
subscriber counts and logs them, and goes on). Cost: O(chunks) per event, in C (``array``,
msgpack) but for one Python pass per field.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

import msgpack

from router.chunks import Chunks
from router.peers.state import KINDS, PeerEvent

__all__ = ["VERSION", "WireError", "decode", "encode"]

VERSION = 1
_FIELDS = 10
_SWAP = sys.byteorder == "big"


class WireError(ValueError):
    """A peer message that is not this format (or not this version of it)."""


def _pack(values: tuple[int, ...], code: str = "Q") -> bytes:
    try:
        a = array(code, values)
    except (OverflowError, TypeError) as exc:
        raise WireError(f"chunks: not 64-bit integers ({exc})") from exc
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def _unpack(raw: object, what: str, code: str = "Q") -> tuple[int, ...]:
    if not isinstance(raw, bytes) or len(raw) % 8:
        raise WireError(f"{what}: expected bytes of 8-byte integers, got {type(raw).__name__}")
    a = array(code)
    a.frombytes(raw)
    if _SWAP:
        a.byteswap()
    return tuple(a)


def _chunks_out(c: Chunks | None, nested: bool = False) -> list[Any] | None:
    if c is None:
        return None
    exact = None if nested else _chunks_out(c.exact, nested=True)
    return [_pack(c.hashes, "q" if nested else "Q"), _pack(c.tokens), c.total, exact]


def _chunks_in(raw: object, nested: bool = False) -> Chunks | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != 4:
        raise WireError(f"chunks: expected [hashes, tokens, total, exact], got {raw!r:.80}")
    hashes = _unpack(raw[0], "chunks.hashes", "q" if nested else "Q")
    tokens = _unpack(raw[1], "chunks.tokens")
    total = raw[2]
    if len(hashes) != len(tokens):
        raise WireError(f"chunks: {len(hashes)} hashes but {len(tokens)} token counts")
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        raise WireError(f"chunks.total: expected an integer >= 0, got {total!r}")
    if nested and raw[3] is not None:
        raise WireError("chunks.exact: nested exact chunks")
    return Chunks(hashes, tokens, total, None if nested else _chunks_in(raw[3], nested=True))


def encode(e: PeerEvent) -> bytes:
    """The payload frame of ``e`` (its ``peer`` travels in the first frame)."""
    return msgpack.packb([VERSION, KINDS.index(e.kind), e.rid, e.replica, float(e.ts),
                          _chunks_out(e.chunks), float(e.prefill), e.stream, e.first, e.status],
                         use_bin_type=True)


def _num(v: object, what: str) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise WireError(f"{what}: expected a number, got {v!r:.40}")
    return float(v)


def decode(peer: bytes, payload: bytes) -> PeerEvent:
    """The event in ``[peer, payload]``; `WireError` when it is not this format."""
    try:
        data = msgpack.unpackb(payload, raw=False, strict_map_key=True)
        name = peer.decode("utf-8")
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # ExtraData is a ValueError
        raise WireError(f"not msgpack / UTF-8: {exc}") from exc
    if not isinstance(data, list) or not data:
        raise WireError(f"expected an array, got {type(data).__name__}")
    if data[0] != VERSION:
        raise WireError(f"version {data[0]!r:.20}, this router speaks {VERSION}")
    if len(data) != _FIELDS:
        raise WireError(f"expected {_FIELDS} fields, got {len(data)}")
    _, kind, rid, replica, ts, chunks, prefill, stream, first, status = data
    if not isinstance(kind, int) or isinstance(kind, bool) or not 0 <= kind < len(KINDS):
        raise WireError(f"kind: expected 0..{len(KINDS) - 1}, got {kind!r:.20}")
    if not isinstance(rid, int) or isinstance(rid, bool):
        raise WireError(f"rid: expected an integer, got {rid!r:.20}")
    if not isinstance(replica, str):
        raise WireError(f"replica: expected a string, got {replica!r:.40}")
    if not isinstance(stream, bool) or not isinstance(first, bool):
        raise WireError(f"stream, first: expected booleans, got {stream!r:.10}, {first!r:.10}")
    if not isinstance(status, int) or isinstance(status, bool):
        raise WireError(f"status: expected an integer, got {status!r:.20}")
    return PeerEvent(KINDS[kind], name, rid, replica, _num(ts, "ts"), _chunks_in(chunks),
                     _num(prefill, "prefill"), stream, first, status)
