"""How fast a PostgreSQL peer that vanished (no FIN, no RST) is given up, on both ends.

A host that loses its network leaves its sessions open on the server, and with them its
advisory locks (one writer per partition, budget holders), until TCP keepalives give up: on
Linux defaults 7,200 s plus 9 x 75 s. One figure, ``BACKFILL_PG_DEAD_PEER_SECONDS``, sets
both ends of every connection the backfill holds:

- server side, per session: ``tcp_keepalives_idle``, ``_interval``, ``_count`` and, where the
  server has it (PostgreSQL 12+), ``tcp_user_timeout``. The server then ends a dead client's
  session, and releases its locks, within the figure.
- client side, libpq's ``keepalives``, ``keepalives_idle``, ``_interval``, ``_count``,
  ``tcp_user_timeout`` and ``connect_timeout``: a worker cut off from the server gets an error
  within the figure instead of a call that hangs for minutes.

``tcp_user_timeout`` bounds the time sent data may stay unacknowledged (a query sent into the
void); keepalives cover a connection with nothing in flight. Parameters already in a URL's
query are the operator's and are kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from backfill_assets.config.variables import DEFAULT_DEAD_PEER_SECONDS
from backfill_assets.domain.urls import parse_database_url

# Probes after the idle time: three, so one lost probe decides nothing.
_PROBES = 3
# ``tcp_user_timeout`` appeared in PostgreSQL 12 (server_version_num 120000).
_USER_TIMEOUT_SINCE = 120000


@dataclass(frozen=True, slots=True)
class DeadPeer:
    """The TCP settings that give up on a silent peer within ``seconds``."""

    seconds: float = DEFAULT_DEAD_PEER_SECONDS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.seconds) and self.seconds >= 2.0):
            raise ValueError(f"dead-peer seconds must be >= 2, got {self.seconds!r}")

    @property
    def idle_s(self) -> int:
        """Silence before the first keepalive probe."""
        return max(1, round(self.seconds / 3))

    @property
    def interval_s(self) -> int:
        """Between probes: idle + probes x interval stays within ``seconds``."""
        return max(1, int((self.seconds - self.idle_s) // _PROBES))

    @property
    def count(self) -> int:
        """Unanswered probes that end the connection."""
        return _PROBES

    @property
    def user_timeout_ms(self) -> int:
        """How long sent data may stay unacknowledged."""
        return int(self.seconds * 1000)

    def client_params(self) -> dict[str, int]:
        """libpq connection parameters (psycopg2 passes them through)."""
        return {
            "keepalives": 1,
            "keepalives_idle": self.idle_s,
            "keepalives_interval": self.interval_s,
            "keepalives_count": self.count,
            "tcp_user_timeout": self.user_timeout_ms,
            # libpq's floor is 2 s; without it a connect to a vanished host waits on SYN
            # retries for about two minutes.
            "connect_timeout": max(2, math.ceil(self.seconds)),
        }

    def server_settings(self, server_version_num: int | None) -> dict[str, int]:
        """The session's own keepalive settings (``tcp_user_timeout`` from PostgreSQL 12)."""
        found = {
            "tcp_keepalives_idle": self.idle_s,
            "tcp_keepalives_interval": self.interval_s,
            "tcp_keepalives_count": self.count,
        }
        if server_version_num is None or server_version_num >= _USER_TIMEOUT_SINCE:
            found["tcp_user_timeout"] = self.user_timeout_ms
        return found

    def missing_client_params(self, query: dict[str, Any]) -> dict[str, int]:
        """``client_params`` minus those the URL already sets (the operator's win)."""
        return {k: v for k, v in self.client_params().items() if k not in query}

    def startup_options(self) -> str:
        """libpq's ``options`` value that applies ``server_settings`` at session start: the one
        way to set the server side through a URL alone (Dagster's storage)."""
        return " ".join(f"-c {k}={v}" for k, v in self.server_settings(None).items())

    def url_with_params(self, url: str) -> str:
        """``url`` with the client parameters it lacks and, unless it has ``options``, the
        server settings as startup options. For Dagster's ``postgres_url``, which accepts no
        connect arguments or session hooks."""
        # Where the query starts as SQLAlchemy reads the URL, not urlsplit: a password may
        # hold '/', '?' or '#' (domain/urls.py).
        parts = parse_database_url(url)
        if parts is None:
            return url  # not a database URL: left for its reader to refuse
        query = dict(parse_qsl(parts.query or "", keep_blank_values=True))
        added: dict[str, Any] = dict(self.missing_client_params(query))
        if "options" not in query:
            added["options"] = self.startup_options()
        if not added:
            return url
        extra = urlencode(added, quote_via=quote)
        return url + ("?" if parts.query is None else "&" if parts.query else "") + extra
