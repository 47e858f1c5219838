"""scripts/bench_block_keys.py on a tiny run: the three kinds of request are timed, their keys
equal full encodes', and the table lands in the page's block-keys section (kept by make bench)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_tiny_run_writes_its_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.templates_audit.tokenizer_families import FAMILIES

    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("bench_block_keys",
                                                  SCRIPTS / "bench_block_keys.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tok = tmp_path / "tokenizer.json"
    tok.write_text(FAMILIES["byte_level"](), encoding="utf-8")
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nGenerated.\n")
    assert mod.main(["--sizes", "300", "--conversations", "3", "--turns", "3", "--check", "1",
                     "--tokenizer", str(tok), "--doc", str(doc)]) == 0
    out = capsys.readouterr().out
    assert "12 key sets equal to a full encode's" in out  # 3 x 3 turns + 3 new conversations
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nGenerated.\n\n<!-- block-keys:begin -->")
    for kind in ("first turn", "later turn", "known system prompt"):
        assert f"| 300 | {kind} | 3 |" in text
