"""Sections of a generated page owned by other scripts, kept across regenerations.

A section is a block ``<!-- NAME:begin -->`` ... ``<!-- NAME:end -->`` (NAME: lowercase letters,
digits and dashes) that a script other than the page's generator writes — e.g.
``loadtest.bench_tracing`` (``tracing-overhead``) or ``scripts/bench_block_keys.py``
(``block-keys``) into docs/benchmarks.md. :func:`replace_block` writes one; :func:`keep_blocks`
is what the generator applies to its freshly rendered page: every block of the old file that the
new text lacks is appended to it, in the old file's order. Blocks do not nest.

Cost: linear in the page's length.
"""

from __future__ import annotations

import re

__all__ = ["blocks", "keep_blocks", "replace_block"]

_BLOCK = re.compile(r"<!-- ([a-z0-9-]+):begin -->.*?<!-- \1:end -->", re.S)


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def blocks(doc: str) -> dict[str, str]:
    """The owned blocks of ``doc`` by name (markers included), in order."""
    return {m.group(1): m.group(0) for m in _BLOCK.finditer(doc)}


def replace_block(doc: str, name: str, block: str) -> str:
    """``doc`` with its block ``name`` replaced by ``block`` (which holds the markers and may end
    with a newline); appended after a blank line when ``doc`` has none."""
    begin, end = _markers(name)
    start = doc.find(begin)
    stop = doc.find(end, start)
    if start >= 0 and stop > start:
        return doc[:start] + block + doc[stop + len(end):].lstrip("\n")
    return (doc.rstrip("\n") + "\n\n" if doc.strip() else "") + block


def keep_blocks(old: str, new: str) -> str:
    """``new`` plus every owned block of ``old`` that ``new`` does not have."""
    have = blocks(new)
    for name, block in blocks(old).items():
        if name not in have:
            new = replace_block(new, name, block + "\n")
    return new
