"""A round-robin TCP splitter: several router processes behind one address.

``python -m loadtest.splitter --port P --upstream 127.0.0.1:8001 --upstream 127.0.0.1:8002``
listens on 127.0.0.1:P and hands each accepted connection to the next upstream in turn, the way
a Kubernetes Service (kube-proxy) spreads connections over several router pods: a connection
stays with its upstream for its whole life, so with a keep-alive client a router process sees
the requests of the connections it was given. Nothing is parsed; bytes are relayed both ways as
they arrive (each read is written at once, so SSE streams are not buffered), with flow control
(a side whose peer cannot keep up stops reading) and half-close (an EOF on one side is passed
on, the other direction keeps going). An upstream that refuses the connection closes the
client's at once. Prints ``ready`` once listening; SIGTERM/SIGINT stop it.

Invariants: connection *i* (in accept order) goes to upstream ``i mod N``; no byte is held
back once read. Cost: one event-loop callback and one ``send`` per chunk read, per direction;
no copies beyond the kernel's (uvloop when installed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from typing import cast

__all__ = ["main", "parse_upstream", "serve"]

Address = tuple[str, int]


class _Relay(asyncio.Protocol):
    """One side of a connection pair: what it reads is written to its peer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Relay | None = None
        self.pending: list[bytes] = []  # read before the peer existed (not expected: we pause)
        self.got_eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def link(self, peer: _Relay) -> None:
        self.peer = peer
        for data in self.pending:
            self.data_received(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
        elif not peer.transport.is_closing():
            peer.transport.write(data)

    def eof_received(self) -> bool:
        self.got_eof = True
        peer = self.peer
        if peer is None or peer.transport is None or peer.transport.is_closing():
            return False
        if peer.got_eof or not peer.transport.can_write_eof():  # both directions are done
            peer.transport.close()
            return False
        peer.transport.write_eof()
        return True  # keep our write side open: the other direction may still be talking

    def connection_lost(self, exc: Exception | None) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.close()

    # flow control: when our peer's buffer is full, stop reading from our peer's source
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Client(_Relay):
    """An accepted connection: paused until its upstream connection is made."""

    def __init__(self, upstreams: Iterator[Address]) -> None:
        super().__init__()
        self.upstreams = upstreams

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.pause_reading()
        host, port = next(self.upstreams)
        asyncio.get_running_loop().create_task(self._connect(host, port))

    async def _connect(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            _t, upstream = await loop.create_connection(_Relay, host, port)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        assert self.transport is not None
        if self.transport.is_closing():  # the client left while we connected
            upstream.transport.close()  # type: ignore[union-attr]
            return
        upstream.link(self)
        self.link(upstream)
        self.transport.resume_reading()


async def serve(port: int, upstreams: Sequence[Address], host: str = "127.0.0.1",
                ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> None:
    """Run the splitter until ``stop`` is set (or forever)."""
    cycle = itertools.cycle(list(upstreams))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(cycle), host, port, reuse_address=True,
                                      backlog=1024)
    if ready is not None:
        ready.set()
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        server.close()
        await server.wait_closed()


def parse_upstream(text: str) -> Address:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.splitter", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--upstream", type=parse_upstream, action="append", required=True,
                   help="HOST:PORT (repeatable; connections alternate in this order)")
    args = p.parse_args(argv)

    async def run() -> None:
        stop, ready = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        task = asyncio.create_task(serve(args.port, args.upstream, args.host, ready, stop))
        await ready.wait()
        print("ready", flush=True)
        await task

    try:
        import uvloop
    except ImportError:
        asyncio.run(run())
    else:
        uvloop.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
