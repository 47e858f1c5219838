"""`python -m loadtest.otlp_sink --port N`: an OTLP/HTTP trace endpoint that accepts and drops.

What the router's tracing costs is measured against a collector that costs the router nothing
extra: this answers every ``POST /v1/traces`` at once with an empty
``ExportTraceServiceResponse`` (zero bytes of protobuf) over keep-alive HTTP/1.1, without
decoding the body, and counts requests and bytes (``GET /stats``). It runs in its own process,
so its CPU is not the router's. Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["main", "serve"]


def serve(port: int) -> ThreadingHTTPServer:
    stats = {"requests": 0, "bytes": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            n = int(self.headers.get("content-length", "0"))
            self.rfile.read(n)
            with lock:
                stats["requests"] += 1
                stats["bytes"] += n
            self.send_response(200 if self.path == "/v1/traces" else 404)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            with lock:
                body = json.dumps(stats).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.otlp_sink", description=__doc__)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    server = serve(args.port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
