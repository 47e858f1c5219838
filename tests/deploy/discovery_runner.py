"""Run a discovery source on its own event loop in a thread and record what it publishes.

`wait_for(predicate)` polls the latest membership with a generous deadline (CI boxes are slow) and
returns the elapsed seconds, which tests record rather than assert on.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from router.discovery import Endpoint


def until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> float:
    """Poll `predicate` until true; the elapsed seconds, or AssertionError after `timeout`."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, f"{what}: not within {timeout}s"
        time.sleep(0.005)
    return time.monotonic() - start


class DiscoveryRunner:
    def __init__(self, discovery: Any) -> None:
        self.discovery = discovery
        self.published: list[list[Endpoint]] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _publish(self, endpoints: list[Endpoint]) -> None:
        with self._lock:
            self.published.append(list(endpoints))

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()  # type: ignore[assignment]
            await self.discovery.run(self._publish)

        try:
            asyncio.run(main())
        except asyncio.CancelledError:
            pass
        except BaseException as exc:
            self.error = exc

    def start(self) -> DiscoveryRunner:
        self._thread.start()
        return self

    def stop(self) -> None:
        deadline = time.monotonic() + 5
        while self._task is None and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)
        assert not self._thread.is_alive(), "discovery did not stop on cancel"

    def __enter__(self) -> DiscoveryRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def latest(self) -> list[Endpoint] | None:
        with self._lock:
            return self.published[-1] if self.published else None

    def by_name(self) -> dict[str, Endpoint]:
        return {e.name: e for e in self.latest or []}

    def wait_for(self, predicate: Callable[[list[Endpoint]], bool], timeout: float = 10.0,
                 what: str = "membership") -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            assert self.error is None, f"discovery crashed: {self.error!r}"
            latest = self.latest
            if latest is not None and predicate(latest):
                return time.monotonic() - start
            time.sleep(0.005)
        raise AssertionError(f"{what} not reached within {timeout}s; last published: "
                             f"{self.latest}")
