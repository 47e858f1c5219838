"""`python -m router` is `prefix-router` without the quick-start demo (that needs the load-test
kit, which the router never imports: `prefix-router serve` alone, or `prefix-loadtest demo`)."""

from __future__ import annotations

import sys

from router.cli import main

sys.exit(main())
