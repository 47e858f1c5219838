"""Report renderers, one module per format, each a pure ``render(report, ...) -> str``:
:mod:`.text` (terminal), :mod:`.json_report` (schema v1), :mod:`.markdown` (PR comment)."""
