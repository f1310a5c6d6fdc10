"""A SQLite file's writer locks: a byte a partition of one lock file (Linux, ``F_OFD_SETLK``),
or ``flock`` on a file a partition elsewhere, in a folder next to the database's real path.

Either lock belongs to the open file: the kernel drops it only when the process closes it or
dies. One file, not one a partition: creating a file costs ~0.5 ms on ext4, paid by every
partition's first run, and 10,000 tenants would leave 10,000 files.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path
from typing import Protocol

from backfill_assets.ledger.locks.fence import PartitionBusy
from backfill_assets.ledger.locks.pg_advisory import pg_lock_id


def lock_dir(database: str) -> Path:
    """The folder of a SQLite file's partition locks, keyed on the file's real path.

    ``sqlite:///store.db`` from its folder, ``sqlite:////abs/store.db`` and a symlink to the
    file are one database, so they must be one lock folder. (Hard links are not: SQLite's own
    journal and WAL files go by name, so a hard-linked database is unsafe anyway.)
    """
    return Path(f"{os.path.realpath(database)}.locks")


class FileLocks(Protocol):
    """A SQLite file's partition locks held by one ``WriterLocks``."""

    def acquire(self, name: str) -> None: ...

    def replaced(self) -> list[str]:
        """Names whose lock file was deleted or replaced since it was locked."""
        ...

    def release(self) -> None: ...


class _FilePerPartition:
    """``flock`` on ``<name>.lock`` in the lock folder (where OFD locks do not exist)."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._fds: list[tuple[str, Path, int]] = []

    def acquire(self, name: str) -> None:
        self._folder.mkdir(parents=True, exist_ok=True)
        path = self._folder / f"{name}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PartitionBusy(f"partition {name} is being written by another process") from None
        self._fds.append((name, path, fd))

    def replaced(self) -> list[str]:
        return [name for name, path, fd in self._fds if not _same_file(path, fd)]

    def release(self) -> None:
        for _name, _path, fd in self._fds:
            os.close(fd)
        self._fds = []


# struct flock on 64-bit Linux: l_type, l_whence (short), l_start, l_len (off_t), l_pid.
_FLOCK = struct.Struct("hhqqi4x")
_OFD = hasattr(fcntl, "F_OFD_SETLK") and struct.calcsize("P") == 8
RANGE_LOCK_FILE = "partitions.lock"


def range_offset(name: str) -> int:
    """A partition's byte in the lock file: its advisory key, made a non-negative offset (a
    62-bit collision would only refuse a partition, never let two writers in)."""
    return pg_lock_id(name) & ((1 << 62) - 1)


class _OneFileRanges:
    """One byte a partition in ``partitions.lock``, each locked with ``F_OFD_SETLK``: owned by
    this object's open file (unlike POSIX ``lockf`` locks, which a process shares across its
    threads and drops when it closes any descriptor of the file)."""

    def __init__(self, folder: Path) -> None:
        self._path = folder / RANGE_LOCK_FILE
        self._fd: int | None = None
        self._names: dict[str, int] = {}

    def acquire(self, name: str) -> None:
        if name in self._names:
            raise PartitionBusy(f"partition {name} is already locked by this run")
        if self._fd is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        offset = range_offset(name)
        try:
            self._set(fcntl.F_WRLCK, offset)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise PartitionBusy(f"partition {name} is being written by another process") from None
        self._names[name] = offset

    def _set(self, kind: int, offset: int) -> None:
        assert self._fd is not None
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, offset, 1, 0))

    def replaced(self) -> list[str]:
        if self._fd is None or _same_file(self._path, self._fd):
            return []
        return sorted(self._names)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops every lock taken through it
        self._fd, self._names = None, {}


def file_locks(database: str) -> FileLocks:
    folder = lock_dir(database)
    return _OneFileRanges(folder) if _OFD else _FilePerPartition(folder)


def _same_file(path: Path, fd: int) -> bool:
    # flock holds the inode we opened; if the path now names another file (deleted and
    # recreated), a second writer can lock that one.
    try:
        st = os.stat(path)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
