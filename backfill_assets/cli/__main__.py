"""``python -m backfill_assets.cli``."""

from backfill_assets.cli import main
from backfill_assets.cli.process import exit_process, freeze_heap

freeze_heap()
exit_process(main())
