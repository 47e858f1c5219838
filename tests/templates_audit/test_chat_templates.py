"""A chat template that injects today's date is a `template` finding even with static messages.

Inline templates only (the real ones in ../shared/data are exercised by scripts/eval_auditor.py).
"""

from __future__ import annotations

import pytest

from templates_audit.analysis import analyze
from templates_audit.render import ChatRenderer
from templates_audit.traces import Record

SYSTEM = "You are a careful assistant. " * 40

INJECTS = (
    "<|start|>system\nToday Date: {{ strftime_now('%d %b %Y') }}\n"
    "{% for m in messages %}{{ m.content }}<|end|>\n{% endfor %}<|start|>assistant\n"
)
DATE_ONLY_WITHOUT_SYSTEM = (
    "{% if messages[0].role != 'system' %}Default prompt. Today is {{ strftime_now('%Y-%m-%d') }}."
    " Be helpful and precise in every answer you give.\n{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
)
UNUSED = (
    "{% set today = strftime_now('%d %b %Y') %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
)
FIXED = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n" + UNUSED

CASES = [
    # (template, messages have a system prompt, expected template findings as (kind, role))
    (INJECTS, True, [("date", "template")]),  # injects today's date before the static prompt
    (INJECTS, False, [("date", "template")]),  # ... with or without a system message
    (DATE_ONLY_WITHOUT_SYSTEM, False, [("date", "template")]),  # default prompt carries the date
    (DATE_ONLY_WITHOUT_SYSTEM, True, []),  # caller's system prompt replaces it: no date
    (UNUSED, True, []),  # computes the date but never prints it
    (FIXED, True, []),  # a fixed date string (Llama 3.1's default) is not volatile
    (None, True, []),  # the default ChatML template injects nothing
]


@pytest.mark.parametrize(("template", "with_system", "expected"), CASES)
def test_template_date_injection(template: str | None, with_system: bool,
                                 expected: list[tuple[str, str]]) -> None:
    records = []
    for i in range(4):
        msgs = [{"role": "user", "content": f"question {i}"}]
        if with_system:
            msgs.insert(0, {"role": "system", "content": SYSTEM})
        records.append(Record("t", i + 1, messages=msgs))
    report = analyze(records, renderer=ChatRenderer(template))
    assert [(f.kind, f.role.value) for f in report.findings] == expected
    for f in report.findings:
        assert f.requests_affected == 4
        # With a system prompt, its static tokens after the date are lost.
        assert f.tokens_lost_per_request > 0 or not with_system
        assert "chat template injects" in f.suggestion


def test_injected_date_is_found_whatever_the_trace_clock() -> None:
    # All requests stamped on one day: the trace alone shows one value, the probe still finds it.
    records = [Record("t", i + 1, messages=[{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": str(i)}],
                      timestamp=1716199200.0 + i) for i in range(3)]
    [f] = analyze(records, renderer=ChatRenderer(INJECTS)).findings
    assert f.distinct_values == 1 and f.examples == ("20 May 2024",)
