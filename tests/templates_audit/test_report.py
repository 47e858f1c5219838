"""report renderers: pure functions of a Report; JSON schema v1; colour only on request."""

from __future__ import annotations

import dataclasses
import json

import pytest

from templates_audit.model import BadLine, Finding, Report, Role, Summary, Template
from templates_audit.report import json_report, markdown, shown, text
from templates_audit.suggest import redact

SUMMARY = Summary(requests=120, bad_lines=2, templates=1, block_size=16,
                  observed_hit_rate=0.25, achievable_hit_rate=0.9)
TEMPLATE = Template("tpl-1", 120, 18, 1007, "You are helpful.\nCurrent date: 2024-05-20", "t:1")
DATE = Finding("tpl-1", "date", Role.SYSTEM, 18, 1, 120, 20, ("2024-05-20", "2024-05-21"), 976.0,
               "move `Current date: …` to the end", before="Current date: ", after="\nRule 0",
               char_start=30, char_end=40)
SECRET = Finding("tpl-1", "secret", Role.SYSTEM, 40, 2, 120, 3, ("sk-`abc|def",), 960.0,
                 "remove credentials from prompts", before="key ", after=" now")
BAD = (BadLine("t.jsonl", 7, "invalid JSON: x"),)
REPORT = Report(SUMMARY, (TEMPLATE,), (DATE, SECRET), BAD)
EMPTY = Report(SUMMARY, (TEMPLATE,), (), ())

REQUIRED = {
    "summary": {"requests", "bad_lines", "templates", "block_size", "observed_hit_rate",
                "achievable_hit_rate"},
    "templates": {"id", "requests", "shared_prefix_tokens", "example_prefix"},
    "findings": {"template", "kind", "role", "first_token", "block", "requests_affected",
                 "distinct_values", "examples", "tokens_lost_per_request", "suggestion"},
    "bad_line_samples": {"file", "line", "error"},
}


@pytest.mark.parametrize("section", sorted(REQUIRED))  # every key the v1 schema promises
def test_json_has_schema_v1_keys(section: str) -> None:
    doc = json.loads(json_report.render(REPORT))
    assert doc["schema_version"] == 1
    items = doc[section] if isinstance(doc[section], list) else [doc[section]]
    assert items and all(REQUIRED[section] <= set(item) for item in items)


def test_json_values() -> None:
    doc = json.loads(json_report.render(REPORT))
    f = doc["findings"][0]
    assert (f["kind"], f["role"], f["first_token"], f["block"]) == ("date", "system", 18, 1)
    assert f["examples"] == ["2024-05-20", "2024-05-21"] and f["tokens_lost_per_request"] == 976.0
    assert doc["findings"][1]["security"] is True and doc["findings"][0]["security"] is False
    assert doc["bad_line_samples"] == [{"file": "t.jsonl", "line": 7, "error": "invalid JSON: x"}]


RENDERERS = [
    # (name, render function) — all pure: same report in, same text out, nothing printed
    ("text", lambda r: text.render(r)),
    ("text-color", lambda r: text.render(r, color=True)),
    ("json", json_report.render),
    ("markdown", markdown.render),
]


@pytest.mark.parametrize(("name", "render"), RENDERERS, ids=[r[0] for r in RENDERERS])
def test_renderers_are_pure(name: str, render, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert render(REPORT) == render(REPORT)
    assert capsys.readouterr() == ("", "")


TEXT_CASES = [
    # (color, must contain, must not contain)
    (False, "«2024-05-20»", "\x1b["),  # no TTY: value in guillemets, no escape codes
    (True, "\x1b[", "«"),  # TTY: value highlighted with ANSI
    (False, "SECURITY", None),  # the secret is flagged as a security problem
    (False, "t.jsonl:7: invalid JSON", None),  # bad lines with file:line
    (False, "observed 25.0%, achievable 90.0%", None),  # whole-trace figures
    (False, "~976 tokens lost per request", None),  # the cost of the finding
    (False, "fix: move `Current date: …` to the end", None),  # the fix
]


@pytest.mark.parametrize(("color", "present", "absent"), TEXT_CASES)
def test_text(color: bool, present: str, absent: str | None) -> None:
    out = text.render(REPORT, color=color)
    assert present in out
    assert absent is None or absent not in out


MD_CASES = [
    # (report, must contain, must not contain)
    (REPORT, "| tpl-1 | **date** | system | 18 (1) | 120 | 20 | `2024-05-20` | 976 |", None),
    (REPORT, "security finding", None),  # banner for secrets
    (REPORT, "`sk-ˋabc¦def`", "sk-`abc|def"),  # backticks/pipes in values cannot break the table
    (EMPTY, "No volatile values break a shared prefix", "| template |"),  # clean report
]


@pytest.mark.parametrize(("report", "present", "absent"), MD_CASES)
def test_markdown(report: Report, present: str, absent: str | None) -> None:
    out = markdown.render(report)
    assert present in out
    assert absent is None or absent not in out


REDACT = [
    # (value, kind, masked) — shape and kind survive, content does not
    ("2024-05-20", "date", "####-##-##"),  # digits -> '#'
    ("08:32PM", "time", "##:##XX"),  # letters -> 'X'/'x' by case
    ("Alice Smith", "name", "A*** S***"),  # names keep initials only
    ("bob@example.com", "email", "b***@***.com"),  # local part and domain hidden, TLD kept
    ("sk-abc123", "secret", "***"),  # secrets keep nothing
    ("7a5c84cc-5040", "uuid", "#x#x##xx-####"),  # ids keep their layout
]


@pytest.mark.parametrize(("value", "kind", "masked"), REDACT)
def test_redact(value: str, kind: str, masked: str) -> None:
    assert redact(value, kind) == masked


def test_markdown_caps_long_tables() -> None:
    many = Report(SUMMARY, (TEMPLATE,), tuple([DATE] * 60), ())
    out = markdown.render(many, max_rows=50)
    assert out.count("| tpl-1 | **date**") == 50 and "10 more findings" in out


@pytest.mark.parametrize(("shared", "said"), [
    (1007, "no findings: the static part is identical across requests"),
    (900, "no findings: the static part varies from token 900 on, too close to its end"),
])
def test_text_says_why_a_template_has_no_findings(shared: int, said: str) -> None:
    tpl = Template("tpl-1", 120, shared, 1007, "You are helpful.", "t:1")
    assert said in text.render(Report(SUMMARY, (tpl,), (), ()), color=False)


TOOLS = "\n".join(f'{{"type": "function", "function": {{"name": "tool_{k}", "description": "x"}}}}'
                  for k in (2, 0, 1))
ORDERS = [
    # (kind, example value, as printed) — a reordered block is shown as its order of lines
    ("reordered_block", TOOLS, "tool_2 | tool_0 | tool_1"),  # what tells the tools apart
    ("reordered_block", "Q: 2+2?\nA: 4\nQ: capital of France?\nA: Paris",
     "Q: 2+2? | A: 4 | Q: capital of France? | A: Paris"),  # nothing in common: first words
    ("reordered_block", "Q: 2+2?<|im_end|>\n<|im_start|>assistant\nA: 4<|im_end|>\n"
     "<|im_start|>user\nQ: hot?<|im_end|>\n<|im_start|>assistant\nA: cold",
     "Q: 2+2? | A: 4 | Q: hot? | A: cold"),  # example turns: markup and role headers go
    ("reordered_block", "one line", "one line"),  # not a block
    ("date", "2024-05-20", "2024-05-20"),  # other kinds: the value itself
]


@pytest.mark.parametrize(("kind", "value", "printed"), ORDERS)
def test_shown(kind: str, value: str, printed: str) -> None:
    assert shown(dataclasses.replace(DATE, kind=kind), value) == printed


def test_text_and_markdown_show_the_order_of_a_reordered_block() -> None:
    f = Finding("tpl-1", "reordered_block", Role.TOOLS, 40, 2, 120, 6, (TOOLS,), 416.0,
                "send the tools in one fixed order", before="<tools>\n", after="\n</tools>")
    report = Report(SUMMARY, (TEMPLATE,), (f,), ())
    assert "      order: tool_2 | tool_0 | tool_1" in text.render(report)
    assert "`tool_2 ¦ tool_0 ¦ tool_1`" in markdown.render(report)
