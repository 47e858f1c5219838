"""scripts/eval_fresh.py's matching on hand-made truth and reports: recall (strict and any kind),
false findings, wrong kinds, duplicates, splits and merges are what the docstring says."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


ev = load("eval_fresh")


def field(name: str, kind: str, role: str, values: list[str], before: str | None = None,
          after: str | None = None, also_ok: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"name": name, "kind": kind, "also_ok": list(also_ok), "role": role,
            "before": before, "after": after, "values": values}


TRUTH: dict[str, Any] = {
    "families": [
        {"name": "concierge", "count": 3, "fields": [
            field("guest", "name", "system", ["Ana Lopez", "Bo Chen"], "You are speaking with ",
                  " (member #"),
            field("member", "numeric_id", "system", ["554963", "112233"], " (member #",
                  ").\n\nRules follow.")]},
        {"name": "agent", "count": 1, "fields": [
            field("tool_order", "reordered_block", "tools", ["search_trains", "book"])]},
        {"name": "faq", "count": 2, "fields": []},
    ],
    "request_families": ["concierge", "concierge", "agent", "faq", "faq", "concierge"],
}


def tpl(tid: str, line: int, requests: int) -> dict[str, Any]:
    return {"id": tid, "requests": requests, "reference": f"/tmp/x/traces.jsonl:{line}"}


def finding(fid: str, template: str, kind: str, examples: list[str], before: str = "",
            after: str = "", role: str = "system") -> dict[str, Any]:
    return {"id": fid, "template": template, "kind": kind, "role": role, "examples": examples,
            "context": {"before": before, "after": after}}


REPORT: dict[str, Any] = {
    "summary": {"templates": 4},
    "templates": [tpl("t1", 1, 2), tpl("t1b", 6, 1), tpl("t2", 3, 1), tpl("t3", 4, 2)],
    "findings": [
        # the name, found by its value, right kind
        finding("f1", "t1", "name", ["Bo Chen"], "…ing with ", " (member #554963)"),
        # the member number with the wrong kind: located by the text before it only
        finding("f2", "t1", "other", ["55-49"], "…Ana Lopez (member #", ""),
        # the name again, in the split-off template of the same family: a duplicate
        finding("f3", "t1b", "name", ["Ana Lopez"]),
        # anything on a static family is false, even a value that exists elsewhere
        finding("f4", "t3", "name", ["Ana Lopez"], "You are speaking with "),
        # the tools field matched by role
        finding("f5", "t2", "reordered_block", ['{"name": "x"}'], role="tools"),
        # nothing of the family: false
        finding("f6", "t1", "date", ["2024-05-01"], "…Today is ", "\nBe brief."),
    ],
}


def test_scores_of_a_hand_made_report() -> None:
    s = ev.evaluate(TRUTH, REPORT)
    assert (s["families"], s["static_families"], s["fields"], s["templates"]) == (3, 1, 3, 4)
    assert s["ratio"] == pytest.approx(4 / 3, abs=1e-3)
    assert (s["found_any"], s["found_strict"]) == (3, 2)          # member found, wrong kind
    assert s["recall_any"] == 1.0 and s["recall_strict"] == pytest.approx(2 / 3, abs=1e-3)
    assert s["missed_strict"] == ["concierge/member"] and s["missed_any"] == []
    assert (s["false"], s["false_on_static"]) == (2, 1)            # f4 (static), f6
    assert sorted(x["id"] for x in s["false_samples"]) == ["f4", "f6"]
    assert s["wrong_kind"] == 1 and s["wrong_kind_samples"][0]["id"] == "f2"
    assert (s["duplicates"], s["duplicated_fields"]) == (1, 1)     # f1 + f3 on concierge/guest
    assert (s["splits"], s["extra_templates"], s["merges"]) == (1, 1, 0)
    assert s["overfull_templates"] == 0


def test_merged_family_and_overfull_template() -> None:
    # one template holds every request: agent and faq have no template of their own
    report = {"summary": {"templates": 1}, "templates": [tpl("all", 2, 6)],
              "findings": [
                  # the agent family's field, found through the merged template by its value
                  finding("g1", "all", "reordered_block", ['{"name": "search_trains"}']),
                  # a part of a value under half its length is no evidence
                  finding("g2", "all", "reordered_block", ["search"]),
              ]}
    s = ev.evaluate(TRUTH, report)
    assert (s["merges"], s["overfull_templates"], s["splits"]) == (2, 1, 0)
    assert s["found_strict"] == 1 and s["missed_any"] == ["concierge/guest", "concierge/member"]
    assert [x["id"] for x in s["false_samples"]] == ["g2"]


def test_unknown_reference_maps_to_no_family() -> None:
    report = {"summary": {"templates": 1}, "templates": [{"id": "u", "reference": "stdin"}],
              "findings": [finding("h1", "u", "name", ["Ana Lopez"])]}
    s = ev.evaluate(TRUTH, report)
    assert s["false"] == 1 and s["found_any"] == 0 and s["merges"] == 3


@pytest.mark.parametrize(("examples", "values", "expected"), [
    (["Ana Lopez"], ["ana  lopez"], True),          # case and whitespace do not matter
    (["T-1142641"], ["1142641"], True),             # the value inside a longer example
    (["- a fact.\n- b fact."], ["- b fact."], True),  # an example holding two block items
    (["first item … last"], ["first item"], True),  # a truncated example, split at the ellipsis
    (["17"], ["17:34"], False),                     # containment needs 4 characters
    (["14:05"], ["14:05"], True),                   # equality needs none
    (["Lopez"], ["Bo Chen"], False),
    (["5521"], ["13355212"], False),                # a short number inside a long id: no
    (["Quinford"], ["Vesna Quinford"], True),       # more than half of the value: a cut example
])
def test_value_match(examples: list[str], values: list[str], expected: bool) -> None:
    assert ev.value_match(examples, values) is expected


@pytest.mark.parametrize(("ctx", "fld", "expected"), [
    ({"before": "…Hotels. You are speaking with "}, {"before": "speaking with "}, True),
    ({"before": "…g with "}, {"before": "speaking with "}, True),  # short tails: 7 chars agree
    ({"before": "with "}, {"before": "with "}, False),              # under 6 chars: no evidence
    ({"after": ", member 5…"}, {"after": ", member "}, True),
    ({"before": "Today is "}, {"before": "speaking with "}, False),
])
def test_context_match(ctx: dict[str, str], fld: dict[str, Any], expected: bool) -> None:
    f = {"examples": [], "context": ctx, "role": "system"}
    assert ev.field_matches(f, {"values": [], "role": "system", **fld}) is expected


def test_reference_line() -> None:
    assert ev.reference_line("/a/b:c/traces.jsonl:17") == 17
    assert ev.reference_line("traces.jsonl") is None
    assert ev.reference_line(None) is None


def test_markdown_has_a_row_per_run_and_a_total() -> None:
    s = ev.evaluate(TRUTH, REPORT)
    rows = [{"side": "old", "generator": "g", "seed": k, "scores": s} for k in (1, 2)]
    out = ev.markdown(rows)
    assert "| old | g | 1 |" in out and "| **old** | **g** | all |" in out
    assert "| 1.00 | 2 |" in out                                    # recall any, false
