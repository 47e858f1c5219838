"""A one-line progress bar on stderr, drawn only when stderr is a terminal.

`Progress.update(done, errors)` redraws at most every ``interval`` seconds (so a fast run does not
spend its time writing to the terminal); `close()` draws the final state and ends the line. When
stderr is not a TTY (CI logs, pipes) nothing is written at all. Cost: O(1) per update.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(self, total: int, label: str = "", *, stream: TextIO | None = None,
                 interval: float = 0.2, enabled: bool | None = None, width: int = 30) -> None:
        self.total = max(total, 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.interval = interval
        self.width = width
        self._t0 = time.monotonic()
        self._last = -interval
        self._done = 0
        self._errors = 0

    def line(self, done: int, errors: int) -> str:
        frac = min(done / self.total, 1.0)
        filled = int(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.monotonic() - self._t0
        return (f"{self.label} [{bar}] {done}/{self.total} errors={errors} "
                f"{elapsed:6.1f}s")

    def update(self, done: int, errors: int = 0) -> None:
        self._done, self._errors = done, errors
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        self._last = now
        self.stream.write("\r" + self.line(done, errors))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line(self._done, self._errors) + "\n")
            self.stream.flush()
