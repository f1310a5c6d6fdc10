"""One provider account's limit shared by every process that uses it.

Each process paces with its own ``EndpointLimiter`` (schedules, AIMD, pauses) but only at its
*fraction* of the configured RPM/TPM. The fraction comes from a membership table in the store:
every member heartbeats its weight (the tenants it is sending for) about once a second and
gets ``own weight / sum of live weights``, so the configured limit is divided fairly per
tenant, not per process. A member killed without leaving stops heartbeating and is dropped
after ``ttl_s``, and its part goes back to the others at their next heartbeat.

The store is injected as two callables, so this module has no SQL and tests can drive it
without a database.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from backfill_assets.providers.ratelimit.limiter import EndpointLimiter


class SharesLike(Protocol):
    """What a heartbeat returns."""

    @property
    def fraction(self) -> float: ...

    @property
    def members(self) -> int: ...


Beat = Callable[[str, str, float], SharesLike]
Leave = Callable[[str, str], None]


@dataclass
class _Membership:
    limiter: EndpointLimiter
    endpoint: str
    member: str
    beat: Beat
    leave: Leave
    interval_s: float
    users: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    members: int = 1
    errors: int = 0


class SharedLimits:
    """Process-wide memberships, one per (limiter, endpoint); runs share them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: dict[tuple[int, str], _Membership] = {}

    @contextlib.contextmanager
    def member(
        self,
        limiter: EndpointLimiter,
        endpoint: str,
        beat: Beat,
        leave: Leave,
        interval_s: float = 1.0,
    ) -> Iterator[None]:
        """Hold a membership for the duration of a run (reference-counted per limiter)."""
        key = (id(limiter), endpoint)
        with self._lock:
            m = self._members.get(key)
            if m is None:
                m = self._members[key] = _Membership(
                    limiter,
                    endpoint,
                    f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
                    beat,
                    leave,
                    interval_s,
                )
            m.users += 1
            if m.thread is None:
                self._beat_once(m)  # the first share is known before the first request
                m.thread = threading.Thread(
                    target=self._loop, args=(m,), name="limit-share", daemon=True
                )
                m.thread.start()
        try:
            yield
        finally:
            self._release(key)

    def refresh(self) -> None:
        """Heartbeat every membership now (tests, and right after a run's tenants change)."""
        with self._lock:
            members = list(self._members.values())
        for m in members:
            self._beat_once(m)

    def _release(self, key: tuple[int, str]) -> None:
        with self._lock:
            m = self._members[key]
            m.users -= 1
            if m.users:
                return
            del self._members[key]
        m.stop.set()
        if m.thread is not None:
            m.thread.join(timeout=5.0)
        with contextlib.suppress(Exception):  # best effort: the TTL drops it otherwise
            m.leave(m.endpoint, m.member)

    def _loop(self, m: _Membership) -> None:
        while not m.stop.wait(m.interval_s):
            self._beat_once(m)

    @staticmethod
    def _beat_once(m: _Membership) -> None:
        try:
            shares = m.beat(m.endpoint, m.member, max(1.0, m.limiter.weight()))
        except Exception:
            # The store is unreachable: keep the last fraction (the writer would fail the run
            # soon anyway); never raise the share on missing information.
            m.errors += 1
            return
        m.members = shares.members
        m.limiter.set_fraction(shares.fraction)


SHARED_LIMITS = SharedLimits()
