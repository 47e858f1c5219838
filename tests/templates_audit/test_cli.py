"""prefix-audit CLI: formats, exit codes, options, inputs (files, gzip, stdin)."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from templates_audit.cli import main

BODY = "\n".join(f"Rule {i}: answer questions about topic {i} carefully." for i in range(30))


def _lines(n: int = 10) -> list[str]:
    out = []
    for i in range(n):
        system = f"Current date: 2024-05-{i % 5 + 1:02d}\n{BODY}"
        out.append(json.dumps({"messages": [{"role": "system", "content": system},
                                            {"role": "user", "content": f"q{i}"}]}))
    return out


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    p = tmp_path / "trace.jsonl"
    p.write_text("\n".join([*_lines(), "not json"]) + "\n")
    return p


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main([*argv, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


CASES = [
    # (extra args, exit code, text expected on stdout or stderr) — what each proves
    ([], 0, "[date] system"),  # default text report with the finding
    (["--format", "markdown"], 0, "## Prefix-cache audit"),  # PR comment format
    (["--fail-under", "0.99"], 1, "below --fail-under"),  # threshold not met -> 1
    (["--fail-under", "1%"], 0, "prefix-audit:"),  # threshold met (percent form) -> 0
    (["--fail-under", "2"], 2, "rate must be within"),  # invalid rate is a usage error
    (["--block-size", "0"], 2, "expected an integer > 0"),  # invalid block size
    (["--tokenizer", "/nonexistent/tokenizer.json"], 2, "tokenizer not found"),  # clear error
    (["--chat-template", "/nonexistent.jinja"], 2, "cannot read chat template"),  # clear error
    (["--redact"], 0, "####-##-##"),  # values masked, shape kept
    (["--no-color"], 0, "«2024-05-0"),  # no colour: guillemets
    (["--color"], 0, "\x1b[1;41;97m"),  # forced colour: ANSI highlight
    (["--block-size", "32"], 0, "block size 32"),  # block size reaches the report
    (["--max-templates", "-1"], 2, "--max-templates must be >= 0"),  # invalid bound
    (["--max-templates", "0", "--format", "json"], 0, '"templates_dropped": 0'),  # unbounded
]


@pytest.mark.parametrize(("extra", "code", "expected"), CASES)
def test_cli(trace: Path, capsys: pytest.CaptureFixture[str], extra: list[str], code: int,
             expected: str) -> None:
    got, out, err = run([str(trace), *extra], capsys)
    assert got == code
    assert expected in out + err


def test_json_output_is_schema_v1(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([str(trace), "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["schema_version"] == 1
    assert doc["summary"]["requests"] == 10 and doc["summary"]["bad_lines"] == 1
    assert doc["bad_line_samples"][0]["line"] == 11
    assert [f["kind"] for f in doc["findings"]] == ["date"]


def test_no_readable_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run([str(tmp_path / "missing.jsonl")], capsys)
    assert code == 2 and "no readable input file" in err


def test_zero_valid_requests_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text("nope\n{}\n")
    code, out, err = run([str(p)], capsys)
    assert code == 2 and "no valid request" in err
    assert f"{p}:1: invalid JSON" in out and f"{p}:2: no recognisable request" in out


def test_gzip_and_stdin(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch) -> None:
    gz = tmp_path / "t.jsonl.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write("\n".join(_lines(4)) + "\n")
    stdin = io.TextIOWrapper(io.BytesIO(("\n".join(_lines(6)) + "\n").encode()))
    monkeypatch.setattr(sys, "stdin", stdin)
    code, out, _ = run([str(gz), "-", "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["summary"]["requests"] == 10


def test_chat_template_option_finds_injected_date(trace: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    tmpl = tmp_path / "t.jinja"
    tmpl.write_text("Today Date: {{ strftime_now('%d %b %Y') }}\n"
                    "{% for m in messages %}{{ m.content }}\n{% endfor %}")
    code, out, _ = run([str(trace), "--chat-template", str(tmpl), "--format", "json"], capsys)
    assert code == 0
    assert ("date", "template") in {(f["kind"], f["role"]) for f in json.loads(out)["findings"]}


def test_missing_tokenizers_package_is_a_clear_error(tmp_path: Path, trace: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import now raises ImportError
    code, _, err = run([str(trace), "--tokenizer", str(tok)], capsys)
    assert code == 2 and "pip install 'prefix-router[tokenizers]'" in err


def test_hf_tokenizer(tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(["Rule", "answer", "date", ":"])}},
        unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    code, out, err = run([str(trace), "--tokenizer", str(path), "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["summary"]["tokenizer"].startswith("hf:")
    assert "encoded whole" not in err  # WordLevel + Whitespace: cuts are proven
    assert [f["kind"] for f in doc["findings"]] == ["date"]
    # the cross-check: every prompt encoded whole gives the same report
    code, whole, _ = run([str(trace), "--tokenizer", str(path), "--format", "json",
                          "--full-encode"], capsys)
    assert code == 0 and whole == out


def test_a_tokenizer_without_proven_cuts_is_noted(tmp_path: Path, trace: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """BPE with dropout: no cut is proven, so every prompt is encoded whole by the library, and
    the CLI says why on stderr."""
    pytest.importorskip("tokenizers")
    from tests.templates_audit.tokenizer_families import FAMILIES

    spec = json.loads(FAMILIES["byte_level"]())
    spec["model"]["dropout"] = 0.1
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    code, _, err = run([str(trace), "--tokenizer", str(path), "--format", "json"], capsys)
    assert code == 0
    assert "prompts were encoded whole (no cut of this tokenizer (BPE" in err


def test_hf_tokenizer_text_it_cannot_encode_is_a_bad_line(tmp_path: Path, trace: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A Hugging Face tokenizer takes only valid Unicode; a lone surrogate (a JSON "\\udc00"
    escape) is that request's bad line, with its number, and the run goes on."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "Rule": 1},
                                                           unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    lines = trace.read_text().splitlines()
    lines.insert(3, json.dumps({"messages": [{"role": "system", "content": "odd \udc00 text"},
                                             {"role": "user", "content": "q"}]}))
    trace.write_text("\n".join(lines) + "\n")
    code, out, _ = run([str(trace), "--tokenizer", str(path), "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["summary"]["requests"] == 10 and doc["summary"]["bad_lines"] == 2
    assert any(b["line"] == 4 and "lone surrogate at character" in b["error"]
               for b in doc["bad_line_samples"])


def test_console_script_and_module_entry_point(trace: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "templates_audit", str(trace), "--format", "json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and json.loads(proc.stdout)["summary"]["requests"] == 10
    assert proc.stderr == ""  # stderr is not a TTY here: no progress bar


PROGRESS = [
    # (enabled, total bytes, expected in the output) — drawn only when enabled (stderr is a TTY)
    (False, 1000, ""),  # not a TTY: nothing at all
    (True, 1000, "%"),  # known size: a percentage bar
    (True, None, "lines"),  # stdin/gzip: counts only
]


@pytest.mark.parametrize(("enabled", "total", "expected"), PROGRESS)
def test_progress_bar(enabled: bool, total: int | None, expected: str,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    from templates_audit import progress

    monkeypatch.setattr(progress, "INTERVAL", 0.0)
    out = io.StringIO()
    bar = progress.Progress(total, stream=out, enabled=enabled)
    for _ in range(3):
        bar.advance(100)
    bar.close()
    text = out.getvalue()
    assert expected in text if expected else text == ""
    assert not enabled or text.endswith("\r\x1b[K")  # the bar is erased before the report


@pytest.mark.parametrize("fmt", ["json", "markdown", "text"])
def test_a_lone_surrogate_in_a_value_is_written_escaped(tmp_path: Path, fmt: str) -> None:
    """A JSON "\\ud800" escape decodes to a lone surrogate, which UTF-8 cannot hold: the report
    (here its example values) shows it as that escape instead of failing after the whole trace
    was read. Run as a real process: its stdout is a real pipe, not pytest's capture."""
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps({"messages": [   # ASCII: the surrogate as "\\ud800"
        {"role": "system", "content": f"Session \ud800{i}x\n{BODY}"},
        {"role": "user", "content": "q"}]}) for i in range(6)) + "\n")
    proc = subprocess.run([sys.executable, "-m", "templates_audit", str(p), "--format", fmt,
                           "--no-progress"], capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stderr
    out = proc.stdout.decode("utf-8")   # valid UTF-8
    assert "\\ud800" in out
    if fmt == "json":   # the escape decodes to the text again (here in the example prefix)
        assert any("Session \ud800" in t["example_prefix"] for t in json.loads(out)["templates"])
