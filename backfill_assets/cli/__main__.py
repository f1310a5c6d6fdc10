"""``python -m backfill_assets.cli``."""

import sys

from . import main

sys.exit(main())
