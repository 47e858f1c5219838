"""Markdown rendering for a pull-request comment. Pure: ``render(report) -> str``.

Values and context are put in code spans with backticks neutralised, so prompt text cannot
break the comment's formatting.
"""

from __future__ import annotations

from templates_audit.model import Finding, Report
from templates_audit.report import shown

__all__ = ["render"]


def _code(text: str) -> str:
    text = text.replace("\n", "⏎").replace("`", "ˋ").replace("|", "¦")
    return f"`{text}`" if text else "``"


def _row(f: Finding) -> str:
    example = shown(f, f.examples[0])[:60] if f.examples else ""
    sec = " ⚠️" if f.security else ""
    return (
        f"| {f.template} | **{f.kind}**{sec} | {f.role.value} | {f.first_token:,} ({f.block:,}) | "
        f"{f.requests_affected:,} | {f.distinct_values:,} | {_code(example)} | "
        f"{f.tokens_lost_per_request:,.0f} |"
    )


def render(report: Report, *, max_rows: int = 50) -> str:
    s = report.summary
    out = [
        "## Prefix-cache audit",
        "",
        f"**{s.requests:,}** requests ({s.bad_lines:,} bad lines), **{s.templates:,}** templates, "
        f"block size {s.block_size}, tokenizer `{s.tokenizer}`.",
        "",
        "| hit rate | observed | achievable |",
        "|---|---|---|",
        f"| prefix cache | {100 * s.observed_hit_rate:.1f}% | {100 * s.achievable_hit_rate:.1f}% |",
        "",
    ]
    if report.security_findings:
        out.append(f"> ⚠️ **{len(report.security_findings)} security finding(s)**: credentials "
                   "in prompts leak into logs and caches.")
        out.append("")
    if not report.findings:
        out.append("No volatile values break a shared prefix. 🎉")
        return "\n".join(out) + "\n"
    out += [
        "| template | kind | role | token (block) | requests | distinct | example | tokens lost/req |",
        "|---|---|---|---|---|---|---|---|",
        *(_row(f) for f in report.findings[:max_rows]),
        *([f"| … {len(report.findings) - max_rows:,} more findings (see `--format json`) |"
           + " |" * 7] if len(report.findings) > max_rows else []),
        "",
        "<details><summary>Suggested fixes</summary>",
        "",
    ]
    for f in report.findings[:max_rows]:
        value = f.examples[0][:60] if f.examples else "…"
        out.append(f"- **{f.template} / {f.kind}** at {_code(f.before[-30:] + '«' + value + '»')}: "
                   f"{f.suggestion}")
    out += ["", "</details>"]
    if report.bad_line_samples:
        out += ["", f"{s.bad_lines:,} bad lines; first: "
                + ", ".join(f"{_code(b.file)}:{b.line} ({b.error})" for b in report.bad_line_samples[:3])]
    return "\n".join(out) + "\n"
