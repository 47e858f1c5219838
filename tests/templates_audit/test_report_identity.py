"""The CLI's JSON report with the incremental tokenizer equals the ``--full-encode`` one, byte
for byte: ``scripts/check_report_identity.py``'s check on small generated bench traces (the
script also runs it on the full bench trace and the ../shared evaluation; this test needs no
data)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("tokenizers")

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _script() -> ModuleType:
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))  # the script imports bench_auditor
    spec = importlib.util.spec_from_file_location("check_report_identity",
                                                  SCRIPTS / "check_report_identity.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("user", ["numbers", "words"])
def test_cli_json_reports_are_byte_identical(tmp_path: Path, user: str) -> None:
    mod = _script()
    tok = tmp_path / "tok" / "tokenizer.json"
    tok.parent.mkdir()
    mod.train_tokenizer(tok, 4)
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b"".join(mod.lines(150, 4, user=user)))
    inc = mod.cli_report(trace, tok, False)
    full = mod.cli_report(trace, tok, True)
    report = json.loads(inc)
    assert report["summary"]["requests"] == 150 and report["findings"]
    assert inc == full


def test_cli_json_reports_are_byte_identical_with_added_tokens(tmp_path: Path) -> None:
    # Llama-3-style: split regex, NFC, trimmed offsets, a BOS post-processor, chat markers
    from tests.templates_audit.tokenizer_families import FAMILIES

    mod = _script()
    tok = tmp_path / "tok" / "tokenizer.json"
    tok.parent.mkdir()
    tok.write_text(FAMILIES["llama3"](), encoding="utf-8")
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b"".join(mod.lines(120, 3)))
    assert mod.cli_report(trace, tok, False, "--block-size", "32") == mod.cli_report(
        trace, tok, True, "--block-size", "32")
