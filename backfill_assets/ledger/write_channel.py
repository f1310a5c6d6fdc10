"""A write connection with a thread of its own: the ledger writer's two channels.

Attempt events commit on one, outcomes on the other (through the fence, when the run holds
writer locks), so neither waits for the other's connection.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy.engine import Connection, Engine

from backfill_assets.ledger.engine import is_sqlite
from backfill_assets.ledger.locks.fence import Fence


class WriteChannel:
    """A write connection and a thread of its own to use it from."""

    def __init__(
        self,
        engine: Engine,
        name: str,
        tx_lock: threading.Lock | None,
        relaxed_commit: bool = False,
        fence: Fence | None = None,
    ) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._engine = engine
        self._conn: Connection | None = None
        self._tx_lock = tx_lock
        self._relaxed = relaxed_commit
        self._fence = fence

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self._engine.connect().execution_options(write=True)
            if self._relaxed and not is_sqlite(self._engine):
                # Attempt events only: the server still makes them durable within
                # wal_writer_delay, and our own SIGKILL cannot lose a commit the server has
                # acknowledged; only a server crash could, and it would lose measurement (an
                # orphan-attempt record), never a result or a usage event.
                self._conn.exec_driver_sql("SET synchronous_commit = off")
                self._conn.commit()
        return self._conn

    @contextlib.contextmanager
    def tx(self) -> Iterator[Connection]:
        """A write transaction on the channel's connection (one thread at a time), or the
        fence's: then it commits only while the run's writer locks are held."""
        lock = self._tx_lock or contextlib.nullcontext()
        if self._fence is not None:
            with lock, self._fence.transaction() as fenced:
                yield fenced
            return
        conn = self._connection()
        with lock, conn.begin():
            yield conn

    @contextlib.contextmanager
    def raw_tx(self) -> Iterator[Any]:
        """A write transaction straight on the driver connection (the per-call hot path)."""
        raw = self._connection().connection.driver_connection
        assert raw is not None
        sqlite = is_sqlite(self._engine)
        lock = self._tx_lock or contextlib.nullcontext()
        with lock:
            if sqlite:
                raw.execute("BEGIN IMMEDIATE")
            try:
                yield raw
            except BaseException:
                raw.rollback() if not sqlite else raw.execute("ROLLBACK")
                raise
            if sqlite:
                raw.execute("COMMIT")
            else:
                raw.commit()

    def close(self) -> None:
        """Close the connection and stop the thread."""

        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        self.pool.submit(_close).result()
        self.pool.shutdown(wait=True)
