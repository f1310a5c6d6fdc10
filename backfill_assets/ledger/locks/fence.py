"""The fence every partition write passes (``Fence``), and what a writer lock raises."""

from __future__ import annotations

import contextlib
from typing import Protocol

from sqlalchemy.engine import Connection


class PartitionBusy(RuntimeError):
    """Another process holds the writer lock of this partition."""


class LockLost(RuntimeError):
    """A writer lock this run held is gone: another run may take, or took, the partition over.

    Raised before anything of the partition is committed; the run stops sending and fails.
    """


class Fence(Protocol):
    """Where partition writes (results, dead letters, usage, batch chunks) commit."""

    def transaction(self) -> contextlib.AbstractContextManager[Connection]:
        """A write transaction that commits only while this run's writer locks are held."""
        ...
