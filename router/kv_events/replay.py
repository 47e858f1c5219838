"""Ask a replica's replay endpoint for the event batches it still buffers (vLLM's protocol).

A DEALER connects to the replica's ROUTER ``replay_endpoint`` and sends ``[b"", start seq]``
(8 bytes, big-endian); the replica answers ``[b"", topic, seq, payload]`` for every batch it
buffers with ``seq >= start``, in order, then the end marker ``[b"", b"", -1, b""]``. `fetch`
returns the ``(seq, payload)`` pairs undecoded (the caller decodes them all before applying
any, so a bad payload fails the whole replay) or raises `ReplayError`: no answer within
``timeout`` seconds of silence, a malformed frame, more than ``limit`` batches, or sequence
numbers that are not consecutive (``silence``: seconds without a frame before it fails). One socket per replay, closed whatever happens.

Cost: O(batches) frames; at most ``timeout`` seconds of waiting per silent gap.
"""

from __future__ import annotations

import zmq
import zmq.asyncio

from router.kv_events.wire import REPLAY_END, WireError, decode_seq, encode_seq

__all__ = ["ReplayError", "fetch"]


class ReplayError(Exception):
    """The replay endpoint did not deliver a complete, well-formed answer."""


async def fetch(ctx: zmq.asyncio.Context, endpoint: str, start: int, silence: float,
                limit: int = 1_000_000) -> list[tuple[int, bytes]]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        await sock.send_multipart([b"", encode_seq(start)])
        out: list[tuple[int, bytes]] = []
        while True:
            if not await sock.poll(int(silence * 1000)):
                raise ReplayError(f"{endpoint}: no answer for {silence:g} s "
                                  f"({len(out)} batches received)")
            frames = await sock.recv_multipart()
            if len(frames) != 4 or frames[0] != b"":
                raise ReplayError(f"{endpoint}: expected 4 frames [b'', topic, seq, payload], "
                                  f"got {len(frames)}")
            try:
                seq = decode_seq(frames[2])
            except WireError as exc:
                raise ReplayError(f"{endpoint}: {exc}") from exc
            if seq == REPLAY_END:
                return out
            if out and seq != out[-1][0] + 1:
                raise ReplayError(f"{endpoint}: batch {seq} follows {out[-1][0]}")
            if not out and seq < start:
                raise ReplayError(f"{endpoint}: batch {seq} before the asked start {start}")
            out.append((seq, frames[3]))
            if len(out) > limit:
                raise ReplayError(f"{endpoint}: more than {limit} batches")
    except zmq.ZMQError as exc:
        raise ReplayError(f"{endpoint}: {exc}") from exc
    finally:
        sock.close(0)
