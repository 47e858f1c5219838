"""`prefix-audit` on hostile input, run as a subprocess: clear errors, bounded memory, no traceback.

Each case writes its input file streaming (never holding it in memory), runs the auditor through
a tiny wrapper that reports the child's peak RSS (``getrusage(RUSAGE_CHILDREN)`` of a process
whose only child is the auditor), and asserts: exit code 0 or 2, no "Traceback" on stderr, the
bad lines named as ``FILE:LINE: reason``, and peak RSS under a bound.

Sizes: the over-long line is 256 MiB in CI and 1 GiB under `scripts/reliability_report.py`
(``RELIABILITY_SCALE`` >= 4); the "million tiny lines" case is 200,000 lines in CI and 1,000,000
in the report - the auditor needs ~36 us per bad line on a 2-core box, i.e. ~36 s per million.
"""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from tests.reliability.conftest import SCALE, scaled

pytestmark = pytest.mark.slow

MiB = 1 << 20
PEAK_RSS_BOUND_KIB = 300 * 1024
VALID = b'{"messages":[{"role":"system","content":"You are a helpful assistant."},' \
        b'{"role":"user","content":"hello"}]}\n'

_WRAPPER = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def run_audit(path: Path) -> tuple[int, str, str, int, float]:
    """exit code, stdout, stderr (without the RSS line), peak RSS KiB, seconds."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _WRAPPER, sys.executable, "-m",
                           "templates_audit", "--no-progress", str(path)],
                          capture_output=True, text=True, errors="replace", timeout=600)
    seconds = time.monotonic() - t0
    lines = proc.stderr.rstrip("\n").split("\n")
    return proc.returncode, proc.stdout, "\n".join(lines[:-1]), int(lines[-1]), seconds


def huge_line(f: IO[bytes], size: int) -> list[int]:
    f.write(VALID)
    f.write(b'{"prompt":"')
    block = b"a" * MiB
    for _ in range(size // MiB):
        f.write(block)
    f.write(b'"}\n')
    f.write(VALID)
    return [2]


def binary_garbage(f: IO[bytes], size: int = 20 * MiB) -> list[int]:
    rng = random.Random(7)
    f.write(VALID)
    for _ in range(size // MiB):
        f.write(rng.randbytes(MiB))
    return []   # line numbers of random newlines are unknown; the count is checked instead


def tiny_lines(f: IO[bytes], n: int) -> list[int]:
    bad = []
    for i in range(1, n + 1):
        if i % 1000 == 1:
            f.write(b'{"prompt":"hi"}\n')
        elif i % 3:
            f.write(b"{}\n")
            bad.append(i)
        else:
            f.write(b"x\n")
            bad.append(i)
    return bad[:5]   # the report lists the first bad lines


def deeply_nested(f: IO[bytes]) -> list[int]:
    f.write(VALID)
    f.write(b'{"messages":' + b"[" * 200_000 + b"]" * 200_000 + b"}\n")
    f.write(b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n")
    f.write(b"[" * 5_000_000 + b"\n")   # unbalanced as well
    return [2, 3, 4]


def gzip_bomb(f: IO[bytes], size: int) -> list[int]:
    with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=1) as gz:
        gz.write(VALID)
        block = b"b" * MiB
        for _ in range(size // MiB):
            gz.write(block)
        gz.write(b"\n")
        gz.write(VALID)
    return [2]


def truncated_gzip(f: IO[bytes]) -> list[int]:
    data = gzip.compress(VALID * 1000)
    f.write(data[: len(data) // 2])
    return []


LONG_LINE = (1024 if SCALE >= 4 else 256) * MiB
CASES: list[tuple[str, str, Callable[[IO[bytes]], list[int]]]] = [
    # (id, file suffix, writer) - what each case proves
    ("huge_line", ".jsonl", lambda f: huge_line(f, LONG_LINE)),      # skipped in bounded chunks
    ("binary_garbage", ".jsonl", binary_garbage),                     # invalid UTF-8, no crash
    ("million_tiny_lines", ".jsonl", lambda f: tiny_lines(f, scaled(200_000))),  # O(1) memory
    ("deeply_nested", ".jsonl", deeply_nested),                       # depth limit, not recursion
    ("gzip_bomb", ".jsonl.gz", lambda f: gzip_bomb(f, 512 * MiB)),    # decompressed line bounded
    ("truncated_gzip", ".jsonl.gz", truncated_gzip),                  # corrupt archive: an error
]


@pytest.mark.parametrize("name, suffix, write", CASES, ids=[c[0] for c in CASES])
def test_hostile_input(tmp_path: Path, measure: Callable[..., None], name: str, suffix: str,
                       write: Callable[[IO[bytes]], list[int]]) -> None:
    path = tmp_path / f"{name}{suffix}"
    with open(path, "wb") as f:
        bad_lines = write(f)
    size = path.stat().st_size
    try:
        code, out, err, peak_kib, seconds = run_audit(path)
    finally:
        path.unlink()
    measure(f"auditor_{name}", input_bytes=size, exit_code=code, peak_rss_mib=round(peak_kib / 1024, 1),
            seconds=round(seconds, 2), stderr_head=err[:200])
    assert code in (0, 2), (code, err[-2000:])
    assert "Traceback" not in err and "Traceback" not in out
    assert peak_kib < PEAK_RSS_BOUND_KIB
    for line in bad_lines:
        assert f"{path}:{line}:" in out, (line, out[-2000:])
    if name == "binary_garbage":
        assert "invalid UTF-8" in out
    if name == "truncated_gzip":
        assert code == 2 or "bad lines" in out
        assert err.strip() or "bad lines" in out   # says something, does not just stop


def test_deep_nesting_reason_is_clear(tmp_path: Path) -> None:
    path = tmp_path / "nested.jsonl"
    path.write_bytes(VALID + json.dumps({"messages": [[[[[[[[[]]]]]]]]]}).encode() + b"\n"
                     + b"[" * 100 + b"]" * 100 + b"\n")
    code, out, err, _, _ = run_audit(path)
    assert code == 0 and "Traceback" not in err
    assert f"{path}:3: nested deeper than" in out


def test_empty_and_unreadable_inputs(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    for path in (empty, tmp_path / "missing.jsonl", tmp_path):
        code, _, err, _, _ = run_audit(path)
        assert code == 2 and "Traceback" not in err and err.strip(), (path, err)
