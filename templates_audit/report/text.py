"""Terminal rendering: templates, each finding with its volatile value highlighted in context,
its cost and its fix. Pure: ``render(report, color=...) -> str``; the caller decides on colour
(only when stdout is a TTY). Without colour the value is shown between ``«»``.
"""

from __future__ import annotations

from templates_audit.model import Finding, Report
from templates_audit.report import shown

__all__ = ["render"]

_RESET = "\x1b[0m"
_BOLD = "\x1b[1m"
_DIM = "\x1b[2m"
_RED = "\x1b[31m"
_YELLOW = "\x1b[33m"
_GREEN = "\x1b[32m"
_HIGHLIGHT = "\x1b[1;41;97m"


def _visible(text: str) -> str:
    return text.replace("\n", "⏎").replace("\t", "→")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, code: str, text: str) -> str:
        return f"{code}{text}{_RESET}" if self.color else text

    def value(self, text: str) -> str:
        return f"{_HIGHLIGHT}{text}{_RESET}" if self.color else f"«{text}»"


def _context(f: Finding, st: _Style) -> str:
    value = f.examples[0] if f.examples else "…"
    before = _visible(f.before[-40:])
    after = _visible(f.after[:40])
    return f"…{st(_DIM, before)}{st.value(_visible(value[:80]))}{st(_DIM, after)}…"


def _finding(f: Finding, st: _Style) -> list[str]:
    head = st(_RED if f.security else _YELLOW, f"[{f.kind}]")
    capped = "+" if f.distinct_values_capped else ""
    lines = [
        f"  {head} {f.role.value}, token {f.first_token:,} (block {f.block:,}): "
        f"{f.distinct_values:,}{capped} distinct values in {f.requests_affected:,} requests, "
        f"~{f.tokens_lost_per_request:,.0f} tokens lost per request",
        f"      {_context(f, st)}",
    ]
    if f.kind == "reordered_block":
        lines += [f"      order: {_visible(shown(f, e)[:120])}" for e in f.examples[:3]]
    elif len(f.examples) > 1:
        lines.append(f"      examples: {', '.join(_visible(e[:40]) for e in f.examples)}")
    lines.append(f"      fix: {st(_GREEN, f.suggestion)}")
    if f.security:
        lines.append(f"      {st(_RED, 'SECURITY: a credential is sent in the prompt')}")
    return lines


def render(report: Report, *, color: bool = False, max_templates: int = 50) -> str:
    st = _Style(color)
    s = report.summary
    gain = s.achievable_hit_rate - s.observed_hit_rate
    out = [
        st(_BOLD, "prefix-audit")
        + f": {s.requests:,} requests, {s.bad_lines:,} bad lines, {s.templates:,} templates, "
        f"block size {s.block_size}, tokenizer {s.tokenizer}",
        f"prefix-cache hit rate: observed {st(_BOLD, _pct(s.observed_hit_rate))}, "
        f"achievable {st(_BOLD, _pct(s.achievable_hit_rate))} "
        f"({100 * gain:+.1f} points if every finding is fixed)",
        f"findings: {len(report.findings):,} ({len(report.security_findings):,} security)",
    ]
    by_template: dict[str, list[Finding]] = {}
    for f in report.findings:
        by_template.setdefault(f.template, []).append(f)
    for t in report.templates[:max_templates]:
        out.append("")
        out.append(
            st(_BOLD, f"template {t.id}")
            + f": {t.requests:,} requests, shared prefix {t.shared_prefix_tokens:,} of "
            f"{t.static_tokens:,} static tokens"
        )
        out.append(f"  {st(_DIM, _visible(t.example_prefix[:100]))}")
        found = by_template.get(t.id, [])
        if not found and t.shared_prefix_tokens < t.static_tokens:
            out.append(f"  no findings: the static part varies from token {t.shared_prefix_tokens:,} "
                       "on, too close to its end for a move to gain a KV block")
        elif not found:
            out.append("  no findings: the static part is identical across requests")
        for f in found:
            out.extend(_finding(f, st))
    if s.templates_dropped:
        out.append(f"\n{s.templates_dropped:,} templates of a single request each are not "
                   "listed (dropped to bound memory: see --max-templates)")
    hidden = len(report.templates) - max_templates
    if hidden > 0:
        out.append(f"\n… {hidden:,} more templates (use --format json for all)")
    if report.bad_line_samples:
        out.append("")
        out.append(f"bad lines: {s.bad_lines:,} (first {len(report.bad_line_samples)}):")
        for b in report.bad_line_samples:
            out.append(f"  {b.file}:{b.line}: {b.error}")
    return "\n".join(out) + "\n"
