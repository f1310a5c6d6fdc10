"""Print ``$DAGSTER_PG_URL`` with the dead-peer parameters it lacks (``bin/prod`` exports it).

dagster-postgres takes its connections' settings from the URL alone, so libpq's keepalives,
``tcp_user_timeout``, ``connect_timeout`` and the server-side keepalives (as startup
``options``) go there, derived from ``BACKFILL_PG_DEAD_PEER_SECONDS`` like the store's.
Parameters the URL already has are kept. Exit 2 on a bad setting.
"""

from __future__ import annotations

import os
import sys

from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.ledger.dead_peer import DeadPeer


def main() -> int:
    """Print the URL (nothing else: the caller captures stdout)."""
    try:
        seconds = Settings.from_env(os.environ).store.pg_dead_peer_seconds
    except SettingsError as exc:
        sys.stderr.write(f"bin/prod: {exc}\n")
        return 2
    sys.stdout.write(DeadPeer(seconds).url_with_params(os.environ["DAGSTER_PG_URL"]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
