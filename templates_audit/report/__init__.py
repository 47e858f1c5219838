"""Report renderers, one module per format, each a pure ``render(report, ...) -> str``:
:mod:`.text` (terminal), :mod:`.json_report` (schema v1), :mod:`.markdown` (PR comment).

Shared here: :func:`shown`, how an example value is printed for people.
"""

from __future__ import annotations

import re
from collections import Counter

from templates_audit.findings import common_prefix
from templates_audit.model import Finding

__all__ = ["shown"]

_LABEL = re.compile(r"[^\",;{}\[\]]{1,24}")
_WORD_END = re.compile(r"\w+$")
_ROLES = frozenset({"system", "developer", "user", "assistant", "model", "tool"})
_MARKUP = re.compile(r"<\|[^|<>]{1,40}\|>|</?[A-Za-z_][\w.-]{0,30}>|\[/?INST\]")


def _order(value: str) -> str:
    """A reordered block as the order of its lines, each by what tells it apart from the others
    (``tool_2 | tool_0 | tool_1`` for a tool list, the first words of each example otherwise)."""
    # Chat-template markup and lines repeated in the block (role headers) tell nothing apart.
    stripped = [_MARKUP.sub("", line).strip() for line in value.split("\n")]
    seen = Counter(stripped)
    lines = [line for line in stripped if line and seen[line] == 1 and line not in _ROLES]
    if len(lines) < 2:
        lines = [line for line in stripped if line]
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
