"""``python -m backfill_assets.cli``."""

from backfill_assets.cli import main
from backfill_assets.cli.process_exit import exit_process

exit_process(main())
