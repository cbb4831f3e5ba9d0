"""``python -m envserver.conformance [ENDPOINT] [options] [-- pytest arguments]``."""

from __future__ import annotations

import sys

from envserver.conformance.runner import main

sys.exit(main())
