"""Report renderers, one module per format, each a pure ``render(report, ...) -> str``:
:mod:`.text` (terminal), :mod:`.json_report` (schema v1), :mod:`.markdown` (PR comment).

Shared here: :func:`shown`, how an example value is printed for people.
"""

from __future__ import annotations

import re

from templates_audit.findings import common_prefix
from templates_audit.model import Finding

__all__ = ["shown"]

_LABEL = re.compile(r"[^\",;{}\[\]]{1,24}")
_WORD_END = re.compile(r"\w+$")


def _order(value: str) -> str:
    """A reordered block as the order of its lines, each by what tells it apart from the others
    (``tool_2 | tool_0 | tool_1`` for a tool list, the first words of each example otherwise)."""
    lines = [line.strip() for line in value.split("\n") if line.strip()]
    # The lines' common prefix is that of the smallest and the largest of them.
    common = min(lines)[:common_prefix(min(lines), max(lines))] if len(lines) > 1 else ""
    common = _WORD_END.sub("", common)  # stop before a word both lines start ("tool_")
    labels = []
    for line in lines:
        m = _LABEL.match(line[len(common):].lstrip())
        labels.append(m.group().strip() if m else line[:24])
    return " | ".join(labels)


def shown(f: Finding, value: str) -> str:
    """``value`` (one of ``f.examples``) as printed: a reordered block as its order of lines."""
    return _order(value) if f.kind == "reordered_block" and "\n" in value else value
