"""`python -m router` is `prefix-router`."""

from __future__ import annotations

import sys

from router.cli import main

sys.exit(main())
