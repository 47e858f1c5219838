"""``python -m templates_audit`` = ``prefix-audit``."""

from __future__ import annotations

from templates_audit.cli import main

raise SystemExit(main())
