"""A server subprocess for a test: started, awaited on its port, stopped (terminate, then kill)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import wait_for_port


@contextlib.contextmanager
def serving(argv: list[str], port: int, log: Path, stop_timeout: float) -> Iterator[str]:
    """Run ``argv`` (listening on 127.0.0.1:``port``, output to ``log``); yield its base URL."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        wait_for_port(port, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=stop_timeout)
