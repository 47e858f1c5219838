"""A tiny blocking HTTP/1.1 client that sends exactly the bytes it is given.

Fuzzing needs requests no well-behaved client library will send (invalid header bytes, lying
Content-Length, broken JSON with a JSON content type), and it needs to be cheap: one kept-alive
connection, no parsing beyond the status line, headers, and a Content-Length or chunked body.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


class NoResponse(Exception):
    """The server closed the connection without answering."""


class RawHTTP:
    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.port = port
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.buf = b""

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self.buf = b""

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.buf = sock, b""
        return sock

    def send(self, raw: bytes) -> Response:
        """Send one request; reconnect once if a kept-alive connection had gone stale."""
        reused = self.sock is not None
        try:
            return self._exchange(raw)
        except (NoResponse, BrokenPipeError, ConnectionResetError):
            self.close()
            if not reused:
                raise
        return self._exchange(raw)

    def _exchange(self, raw: bytes) -> Response:
        sock = self.sock or self._connect()
        sock.sendall(raw)
        while True:   # interim answers ("100 Continue" to an Expect) precede the response
            head = self._until(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            if not 100 <= status < 200 or status == 101:
                break
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if raw.startswith(b"HEAD ") or status in (204, 304, 101):
            body = b""
        elif "content-length" in headers:
            body = self._exactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._chunked()
        else:
            body = self._to_eof()
        if headers.get("connection", "").lower() == "close":
            self.close()
        return Response(status, headers, body)

    def _fill(self) -> None:
        assert self.sock is not None
        data = self.sock.recv(65536)
        if not data:
            raise NoResponse("connection closed by the server")
        self.buf += data

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            self._fill()
        out, _, self.buf = self.buf.partition(marker)
        return out

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int(self._until(b"\r\n").split(b";")[0], 16)
            if size == 0:
                self._until(b"\r\n")
                return b"".join(parts)
            parts.append(self._exactly(size))
            self._exactly(2)

    def _to_eof(self) -> bytes:
        try:
            while True:
                self._fill()
        except NoResponse:
            pass
        out = self.buf
        self.close()
        return out


def request(method: str, path: str, body: bytes = b"",
            headers: list[tuple[bytes, bytes]] | None = None, *,
            content_type: bytes | None = b"application/json",
            content_length: bytes | None = None) -> bytes:
    lines = [method.encode("latin-1") + b" " + path.encode("latin-1") + b" HTTP/1.1",
             b"Host: 127.0.0.1"]
    if content_type is not None:
        lines.append(b"Content-Type: " + content_type)
    lines.append(b"Content-Length: " + (content_length if content_length is not None
                                         else str(len(body)).encode()))
    for name, value in headers or ():
        lines.append(name + b": " + value)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
