"""Owned sections of a generated page survive its regeneration (loadtest.doc_blocks)."""

from __future__ import annotations

from pathlib import Path

from loadtest.bench import _write_doc
from loadtest.bench_tracing import BEGIN, END, keep_block
from loadtest.doc_blocks import blocks, keep_blocks, replace_block


def _block(name: str, body: str) -> str:
    return f"<!-- {name}:begin -->\n## {name}\n\n{body}\n<!-- {name}:end -->\n"


PAGE = "# Benchmarks\n\nGenerated.\n\n## Reproduce\n\nmake bench\n"


def test_replace_block_appends_then_replaces_in_place() -> None:
    one = replace_block(PAGE, "block-keys", _block("block-keys", "v1"))
    assert one == PAGE + "\n" + _block("block-keys", "v1")
    two = replace_block(one + "tail\n", "block-keys", _block("block-keys", "v2"))
    assert two == PAGE + "\n" + _block("block-keys", "v2") + "tail\n"
    assert replace_block("", "x", _block("x", "a")) == _block("x", "a")


def test_keep_blocks_keeps_every_owned_section_in_order() -> None:
    old = replace_block(replace_block(PAGE, "tracing-overhead", _block("tracing-overhead", "t")),
                        "block-keys", _block("block-keys", "k"))
    regenerated = PAGE.replace("Generated.", "Generated again.")
    kept = keep_blocks(old, regenerated)
    assert kept.startswith(regenerated.rstrip("\n"))
    assert list(blocks(kept)) == ["tracing-overhead", "block-keys"]
    assert blocks(kept) == blocks(old)
    assert keep_blocks(kept, regenerated) == kept  # idempotent
    assert keep_blocks(PAGE, regenerated) == regenerated  # nothing to keep
    # a block the new text already has is the new one
    fresh = replace_block(regenerated, "block-keys", _block("block-keys", "new"))
    assert blocks(keep_blocks(old, fresh))["block-keys"] == _block("block-keys", "new").rstrip()


def test_keep_blocks_agrees_with_the_tracing_only_helper() -> None:
    tracing = f"{BEGIN}\n## Tracing overhead\n\nrows\n{END}"
    old = PAGE + "\n" + tracing + "\n"
    assert keep_blocks(old, PAGE) == keep_block(old, PAGE)


def test_make_bench_write_keeps_the_block_keys_section(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(replace_block(PAGE, "block-keys", _block("block-keys", "table")))
    _write_doc(doc, PAGE.replace("Generated.", "Regenerated."))
    text = doc.read_text()
    assert "Regenerated." in text and blocks(text)["block-keys"].endswith("block-keys:end -->")
    assert "table" in text
