"""The embedded event log's shard files: how a connection to one is set up, how a new run's
shard is placed, and what a killed process leaves behind (``sqlite_event_log.py`` uses them).

A new run's shard is a copy of an empty one made once a process by Dagster's own ``_initdb``,
which creates the tables and stamps the migrations by reading every migration script (~60 ms
a run here). The copy is written beside the shard, fsynced and linked into place, so it never
replaces a shard another process created meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

# An empty run shard as the installed Dagster makes it, once a process.
_EMPTY_SHARD: bytes | None = None
# What a process SIGKILLed inside ``place_new_shard`` leaves: ``<run>.db.<pid>.new`` and
# ``.empty-shard.<pid>.db`` (with its -wal/-shm). Nothing reads them.
_LEFTOVER = re.compile(r"^(?:.+\.db\.(\d+)\.new|\.empty-shard\.(\d+)\.db(?:-wal|-shm)?)$")


def normal_sync(dbapi_conn: Any, _record: Any) -> None:
    """A new connection's ``synchronous=NORMAL`` (a SQLAlchemy ``connect`` listener)."""
    # WAL + NORMAL, as the store (ledger/engine.py): a commit survives a SIGKILL of the process,
    # only a power loss can drop the last ones, and the next `run` then plans their partitions
    # again (their results are in the store). FULL's fsync a commit cost ~10% of a run of 2,000
    # one-partition tenants here.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def place_new_shard(path: str, base_dir: str, initdb: Callable[[Engine], None]) -> bool:
    """Write the empty shard at ``path``; False when a shard is there already (another
    process made it first)."""
    global _EMPTY_SHARD
    if _EMPTY_SHARD is None:
        _EMPTY_SHARD = _empty_shard(base_dir, initdb)
    tmp = f"{path}.{os.getpid()}.new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, _EMPTY_SHARD)
        os.fsync(fd)  # a new shard is as durable as one SQLite wrote itself
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # never replaces a shard another process created meanwhile
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    return True


def _empty_shard(base_dir: str, initdb: Callable[[Engine], None]) -> bytes:
    path = os.path.join(base_dir, f".empty-shard.{os.getpid()}.db")
    engine = sa.create_engine(f"sqlite:///{path}", poolclass=NullPool)
    try:
        initdb(engine)
        engine.dispose()  # the last connection closed: the file holds everything
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + suffix)


def sweep_leftovers(base_dir: str) -> None:
    """Remove the temporary shard files of processes that are gone."""
    with contextlib.suppress(OSError):
        for name in os.listdir(base_dir):
            match = _LEFTOVER.match(name)
            if match is None or _alive(int(match[1] or match[2])):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(base_dir, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
