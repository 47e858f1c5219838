"""JSON rendering of a report — schema version 1 (documented in docs/auditor.md).

Pure: ``render(report) -> str``. Keys are API: adding keys is compatible, renaming or removing
one bumps ``schema_version``.
"""

from __future__ import annotations

import json
from typing import Any

from templates_audit.model import SCHEMA_VERSION, Finding, Report, Template

__all__ = ["render", "to_dict"]


def _template(t: Template) -> dict[str, Any]:
    return {
        "id": t.id,
        "requests": t.requests,
        "shared_prefix_tokens": t.shared_prefix_tokens,
        "static_tokens": t.static_tokens,
        "example_prefix": t.example_prefix,
        "reference": t.reference,
    }


def _finding(f: Finding) -> dict[str, Any]:
    return {
        "id": f.id,
        "template": f.template,
        "kind": f.kind,
        "role": f.role.value,
        "first_token": f.first_token,
        "block": f.block,
        "requests_affected": f.requests_affected,
        "distinct_values": f.distinct_values,
        "distinct_values_capped": f.distinct_values_capped,
        "examples": list(f.examples),
        "tokens_lost_per_request": f.tokens_lost_per_request,
        "suggestion": f.suggestion,
        "security": f.security,
        "context": {"before": f.before, "after": f.after},
        "chars": [f.char_start, f.char_end],
    }


def to_dict(report: Report) -> dict[str, Any]:
    s = report.summary
    return {
        "schema_version": SCHEMA_VERSION,
        "summary": {
            "requests": s.requests,
            "bad_lines": s.bad_lines,
            "templates": s.templates,
            "block_size": s.block_size,
            "observed_hit_rate": round(s.observed_hit_rate, 6),
            "achievable_hit_rate": round(s.achievable_hit_rate, 6),
            "prompt_tokens": s.prompt_tokens,
            "tokenizer": s.tokenizer,
            "first_timestamp": s.first_timestamp,
            "last_timestamp": s.last_timestamp,
            "templates_dropped": s.templates_dropped,
        },
        "templates": [_template(t) for t in report.templates],
        "findings": [_finding(f) for f in report.findings],
        "bad_line_samples": [
            {"file": b.file, "line": b.line, "error": b.error} for b in report.bad_line_samples
        ],
    }


def render(report: Report, *, indent: int | None = 2) -> str:
    return json.dumps(to_dict(report), ensure_ascii=False, indent=indent) + "\n"
