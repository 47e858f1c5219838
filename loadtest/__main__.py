"""`python -m loadtest ...` is `prefix-loadtest ...` (the fleet starts replicas this way)."""

from __future__ import annotations

import sys

from loadtest.cli import main

sys.exit(main())
