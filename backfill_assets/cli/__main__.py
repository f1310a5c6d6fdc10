"""``python -m backfill_assets.cli``."""

import sys

from backfill_assets.cli import main

sys.exit(main())
