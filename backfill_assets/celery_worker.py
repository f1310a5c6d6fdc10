"""The Celery app ``bin/prod worker`` runs: ``celery -A backfill_assets.celery_worker worker``.

Like ``definitions.py``, it reads this process's environment once: the broker
(``BACKFILL_CELERY_BROKER_URL``) and the settings the steps it runs load the code location
with. The steps themselves arrive as dagster-celery's tasks; each loads the job from
``definitions.py`` and the instance from the run's own reference.
"""

from __future__ import annotations

import os

from backfill_assets.config.settings import Settings
from backfill_assets.defs.celery_steps import worker_app
from backfill_assets.ledger.private_files import private_umask

private_umask()
_settings = Settings.from_env(os.environ)
app = worker_app(_settings.orchestration.celery_broker_url, _settings.store.pg_dead_peer_seconds)
