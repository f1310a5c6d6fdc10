"""The writer locks of a run's partitions, and the fence every partition write passes.

PostgreSQL (``pg_advisory.py``): session advisory locks, all on one connection. That same
session carries every fenced transaction (``WriterLocks.transaction``): each one first proves,
against ``pg_locks`` for its own backend, that the session still holds every lock it took. A
session-level lock goes only with its session (a run never unlocks before it ends), so a
transaction that starts holding the locks holds them until it commits; a session the server
ended (a silent peer given up, ``pg_terminate_backend``) cannot commit at all, and a
connection replaced behind our back is a new backend that holds nothing, so its check fails.
Cost: one query per commit.

SQLite file (``sqlite_files.py``): a lock owned by an open file, which the kernel drops only
when the process closes it or dies; a SQLite file is one host's, so its writers vanish
together with that host and no second writer can lock while the first lives. Nothing more is
needed; the one way around it, deleting a lock file under a live run (a cleanup script), is
caught in the same transaction (two ``stat`` calls a file).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Iterator, Sequence
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from backfill_assets.domain.work.keys import SLICE_COUNT, slice_key, validate_tenant_id
from backfill_assets.ledger.engine import engine_dead_peer, is_sqlite, make_engine, write_tx
from backfill_assets.ledger.locks.fence import LockLost, PartitionBusy
from backfill_assets.ledger.locks.pg_advisory import (
    FENCE,
    HELD_ADVISORY,
    HOLDERS,
    RELEASE,
    TAKE,
    pg_lock_id,
)
from backfill_assets.ledger.locks.sqlite_files import FileLocks, file_locks

T = TypeVar("T")


_local_locks: dict[str, threading.Lock] = {}
_local_guard = threading.Lock()


def _lock_name(tenant_id: str, slice_no: int) -> str:
    # Lock names become file names: only a validated tenant id and an in-range slice.
    validate_tenant_id(tenant_id)
    if (
        isinstance(slice_no, bool)
        or not isinstance(slice_no, int)
        or not 0 <= slice_no < SLICE_COUNT
    ):
        raise ValueError(f"slice {slice_no!r} is not a slice number")
    return f"{tenant_id}.{slice_key(slice_no)}"


class WriterLocks:
    """Exclusive per-partition writer locks, released by the OS or server when the holder dies,
    and the fence (``transaction``) that every write of the locked partitions goes through.

    PostgreSQL: session advisory locks, all on one connection (so a run over many partitions
    costs one connection), which also carries the fenced transactions. SQLite file: a byte a
    partition of one lock file (Linux), or a file a partition, in a folder next to the
    database's real path. In-memory SQLite: a process-local lock.

    A lock can be lost while the run goes on: the server ends the lock session (a host that
    went silent, ``pg_terminate_backend``, a proxy), the connection breaks, or the lock file
    is deleted and recreated by someone else. The next fenced transaction then refuses to
    commit; ``lost()`` (polled by ``while_held``) stops the run sooner when nothing commits.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: Connection | None = None
        self._pg_pid: int | None = None
        self._files: FileLocks | None = None
        self._held_local: list[threading.Lock] = []
        self._pg_ids: dict[int, str] = {}
        # The lock session is used from the flush thread, the lock poll and batch steps.
        self._mutex = threading.Lock()
        self._why = ""

    def acquire(self, tenant_id: str, slice_no: int) -> None:
        """Take the lock or raise ``PartitionBusy``; an invalid tenant id raises ``ValueError``."""
        busy = self.acquire_many([(tenant_id, slice_no)])
        if busy:
            raise PartitionBusy(next(iter(busy.values())))

    def acquire_many(self, parts: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """Take each (tenant, slice)'s lock; returns those another writer holds, each with
        why (the others are taken). PostgreSQL takes them in one round trip: one each was
        three (the statement, its BEGIN and COMMIT), 30,000 for 10,000 small tenants. An
        invalid tenant id raises ``ValueError`` before any lock is taken."""
        names = {p: _lock_name(*p) for p in dict.fromkeys(parts)}
        if not is_sqlite(self._engine):
            with self._mutex:
                taken = self._acquire_pg(list(names.values()))
            return {
                p: f"partition {n} is being written by another process"
                for p, n in names.items()
                if n not in taken
            }
        busy: dict[tuple[str, int], str] = {}
        for p, name in names.items():
            try:
                self._acquire_file(name)
            except PartitionBusy as exc:
                busy[p] = str(exc)
        return busy

    def _acquire_file(self, name: str) -> None:
        db = self._engine.url.database
        if db in (None, "", ":memory:"):
            with _local_guard:
                lock = _local_locks.setdefault(name, threading.Lock())
            if not lock.acquire(blocking=False):
                raise PartitionBusy(f"partition {name} is being written by another thread")
            self._held_local.append(lock)
            return
        if self._files is None:
            self._files = file_locks(db)
        self._files.acquire(name)

    def _acquire_pg(self, names: Sequence[str]) -> set[str]:
        """The names of ``names`` whose locks this session took."""
        ids = {pg_lock_id(n): n for n in names}
        first = names[0] if names else ""
        if not ids:
            return set()
        if self._conn is None:
            self._conn = self._engine.connect()
        elif self._pg_ids and (self._conn.invalidated or self._conn.closed):
            raise LockLost(f"writer locks lost before taking {first}")
        try:
            rows = self._conn.execute(TAKE, {"keys": list(ids)}).all()
            self._conn.commit()
        except sa.exc.SQLAlchemyError as exc:
            raise LockLost(f"the lock connection failed while taking {first}: {exc}") from exc
        pid = int(rows[0].pid)
        got = [int(r.k) for r in rows if r.ok]
        if not self._pg_ids:
            self._pg_pid = pid  # it holds none of ours yet: this session is the one
        elif pid != self._pg_pid:
            # Never take new locks on a session that silently replaced the one holding ours
            # (a new backend holds none of them). Checked in the same statement: a check of
            # every held lock before each new one cost a run of 500 partitions 125,000 rows
            # of pg_locks. A lock lost otherwise fails the next fenced commit (``_prove``).
            if got:
                with contextlib.suppress(sa.exc.SQLAlchemyError):
                    self._conn.execute(RELEASE, {"keys": got})
                    self._conn.commit()
            self._why = "its session ended and the connection was replaced"
            raise LockLost(f"writer locks lost before taking {first}")
        for k in got:
            self._pg_ids[k] = ids[k]
        return {ids[k] for k in got}

    def lost(self) -> list[str]:
        """Names of the locks this object took that it no longer holds (cheap; poll it)."""
        gone = self._replaced_files()
        if self._pg_ids:
            with self._mutex:
                gone += self._lost_pg()
        return gone

    def _replaced_files(self) -> list[str]:
        gone = self._files.replaced() if self._files is not None else []
        if gone:
            self._why = "its lock file was deleted or replaced, so another run can lock a new one"
        return gone

    def _lost_pg(self) -> list[str]:
        assert self._conn is not None
        everything = sorted(self._pg_ids.values())
        if self._conn.invalidated or self._conn.closed:
            return everything  # the reason was recorded when it broke
        try:
            # A dropped connection would be replaced on next use: a new backend holds nothing.
            pid = int(self._conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
            held = {int(k) for k in self._conn.execute(HELD_ADVISORY).scalars()}
            self._conn.commit()
        except sa.exc.SQLAlchemyError as exc:  # dropped, or invalidated by an earlier drop
            self._why = f"the connection holding it failed ({_first_line(exc)})"
            return everything
        if pid != self._pg_pid:
            self._why = "its session ended and the connection was replaced"
            return everything
        missing = sorted(n for k, n in self._pg_ids.items() if k not in held)
        if missing:
            self._why = "its session no longer holds it"
        return missing

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction that commits only while every lock taken here is held.

        PostgreSQL: on the lock session, after the ``pg_locks`` check; SQLite: ``BEGIN
        IMMEDIATE`` on a pooled connection, after checking the lock files. Raises ``LockLost``
        (and commits nothing) when a lock is gone.
        """
        if is_sqlite(self._engine):
            with write_tx(self._engine) as local:
                gone = self._replaced_files()
                if gone:
                    raise self.lost_error(gone)
                yield local
            return
        with self._mutex:
            conn = self._conn
            if conn is None:
                raise LockLost("this run holds no writer lock to write under")
            if conn.invalidated or conn.closed:
                raise self.lost_error(sorted(self._pg_ids.values()))
            try:
                with conn.begin():
                    self._prove(conn)
                    yield conn
            except sa.exc.SQLAlchemyError as exc:
                if not conn.invalidated:
                    raise  # not the connection: a real error in the writes
                self._why = f"the connection holding it failed ({_first_line(exc)})"
                raise self.lost_error(sorted(self._pg_ids.values())) from exc

    def _prove(self, conn: Connection) -> None:
        row = conn.execute(FENCE, {"keys": list(self._pg_ids)}).one()
        if int(row.pid) == self._pg_pid and int(row.held) == len(self._pg_ids):
            return
        if int(row.pid) != self._pg_pid:
            self._why = "its session ended and the connection was replaced"
            gone = sorted(self._pg_ids.values())
        else:
            held = {int(k) for k in conn.execute(HELD_ADVISORY).scalars()}
            gone = sorted(n for k, n in self._pg_ids.items() if k not in held)
            self._why = "its session no longer holds it"
        raise self.lost_error(gone, holders=self._holders(conn, gone))

    def _holders(self, conn: Connection, names: list[str]) -> str:
        """Who holds ``names`` now, as a phrase ('' if nobody, or unknown)."""
        keys = [k for k, n in self._pg_ids.items() if n in names]
        try:
            rows = conn.execute(HOLDERS, {"keys": keys, "mine": self._pg_pid or 0}).all()
        except sa.exc.SQLAlchemyError:
            return ""
        who = sorted(
            {
                f"backend {r.pid}" + (f" '{r.application_name}'" if r.application_name else "")
                for r in rows
            }
        )
        return ", ".join(who[:3])

    def _holders_now(self, names: list[str]) -> str:
        """``_holders`` over a new connection (the lock's is gone); '' if the server cannot be
        reached, which takes at most the dead-peer time."""
        probe = make_engine(
            self._engine.url.render_as_string(hide_password=False), engine_dead_peer(self._engine)
        )
        try:
            with probe.connect() as conn:
                return self._holders(conn, names)
        except sa.exc.SQLAlchemyError:
            return ""
        finally:
            probe.dispose()

    def lost_error(self, names: list[str], holders: str | None = None) -> LockLost:
        """The error that stops a run whose locks ``names`` are gone, naming the takeover.

        Blocking on PostgreSQL: it asks the server who holds them now (not on the event loop).
        """
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        why = self._why or "it is no longer held"
        if holders is None and self._pg_ids:
            holders = self._holders_now(names)
        if holders:
            taken = f"taken over by another writer ({holders})"
        elif is_sqlite(self._engine):
            taken = "free to be taken over by another run"
        else:
            taken = (
                "free to be taken over by another run (PostgreSQL ends a silent session, and "
                "frees its locks, within BACKFILL_PG_DEAD_PEER_SECONDS)"
            )
        return LockLost(
            f"partition(s) {shown} {taken}: this run's writer lock is gone ({why}). This run "
            "committed nothing more for them, stopped sending and failed; the calls it had in "
            "flight show as orphan attempts. Re-run to finish them."
        )

    def release_all(self) -> None:
        """Release every lock held (locks already lost need no release)."""
        with self._mutex:
            if self._conn is not None:
                try:
                    if self._pg_ids:
                        self._conn.execute(RELEASE, {"keys": list(self._pg_ids)})
                    self._conn.commit()
                except sa.exc.SQLAlchemyError:
                    pass  # the session is gone, and the server released its locks with it
                finally:
                    self._conn.close()
                    self._conn = None
        if self._files is not None:
            self._files.release()
        for lock in self._held_local:
            lock.release()
        self._held_local, self._pg_ids = [], {}

    def __enter__(self) -> WriterLocks:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release_all()


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


# How often a run checks that it still holds its writer locks when nothing commits (each
# commit checks too): the longest a run can go on sending after losing one, plus the calls
# then in flight.
LOCK_CHECK_SECONDS = 2.0


async def while_held(
    locks: WriterLocks, work: Awaitable[T], period_s: float = LOCK_CHECK_SECONDS
) -> T:
    """Await ``work``; if a lock is found lost, cancel it and raise ``LockLost``.

    Cancelling stops new calls at once; the work's clean-up cannot commit for the lost
    partitions (the fence refuses), so what was paid but not committed is re-paid by the run
    that takes over: at most the calls in flight, as after a crash.
    """
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=period_s)
            if done:
                return await _result(locks, task)
            lost = await asyncio.to_thread(locks.lost)
            if lost:
                break
    except BaseException:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise await asyncio.to_thread(locks.lost_error, lost)


async def _result(locks: WriterLocks, task: asyncio.Future[T]) -> T:
    """The work's result; a failure while the locks are gone (a store connection of the run
    broke first, say) is the lost locks' error, which names the takeover."""
    try:
        return task.result()
    except LockLost:
        raise
    except Exception as exc:
        lost = await asyncio.to_thread(locks.lost)
        if not lost:
            raise
        raise await asyncio.to_thread(locks.lost_error, lost) from exc
