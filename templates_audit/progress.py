"""A one-line progress bar on stderr, drawn only when stderr is a TTY.

Redraws at most every :data:`INTERVAL` seconds, so the per-request cost is one clock read and a
few additions. Shows bytes read (a percentage when the total size is known) and requests/s.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]

INTERVAL = 0.2


class Progress:
    def __init__(self, total_bytes: int | None = None, stream: TextIO | None = None,
                 enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total = total_bytes
        self.bytes = 0
        self.requests = 0
        self._start = time.monotonic()
        self._next = self._start + INTERVAL
        self._drawn = False

    def advance(self, nbytes: int) -> None:
        self.bytes += nbytes
        self.requests += 1
        if self.enabled:
            now = time.monotonic()
            if now >= self._next:
                self._next = now + INTERVAL
                self._draw(now)

    def _draw(self, now: float) -> None:
        rate = self.requests / max(now - self._start, 1e-9)
        mib = self.bytes / (1 << 20)
        if self.total:
            frac = min(self.bytes / self.total, 1.0)
            filled = int(frac * 30)
            bar = "#" * filled + "-" * (30 - filled)
            text = f"\r[{bar}] {100 * frac:5.1f}%  {mib:,.1f} MiB  {self.requests:,} lines  {rate:,.0f}/s"
        else:
            text = f"\r{mib:,.1f} MiB  {self.requests:,} lines  {rate:,.0f}/s"
        self.stream.write(text)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
