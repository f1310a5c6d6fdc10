"""What the simulator saw and billed, readable from any thread.

A call is billed exactly when the simulator answered 200 with a ``usage`` object, including
answers whose content is wrong on purpose; errors, rate limits, hangs and resets cost nothing.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class BilledCall:
    """One billed completion."""

    request_id: str
    correlation_id: str
    model: str
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class MeterSnapshot:
    """A consistent copy of the meter at one instant."""

    requests_total: int
    responses_by_status: dict[int, int]
    billed: dict[str, BilledCall]
    billed_tokens_total: int
    calls_by_correlation_id: dict[str, int]
    timestamps: tuple[float, ...]
    dropped: dict[str, int]

    @property
    def billed_prompt_tokens(self) -> int:
        """Sum of billed prompt tokens."""
        return sum(call.prompt_tokens for call in self.billed.values())

    @property
    def billed_completion_tokens(self) -> int:
        """Sum of billed completion tokens."""
        return sum(call.completion_tokens for call in self.billed.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as served by ``GET /_sim/meter``."""
        return {
            "requests_total": self.requests_total,
            "responses_by_status": {str(k): v for k, v in self.responses_by_status.items()},
            "billed": [asdict(call) for call in self.billed.values()],
            "billed_tokens_total": self.billed_tokens_total,
            "calls_by_correlation_id": dict(self.calls_by_correlation_id),
            "timestamps": list(self.timestamps),
            "dropped": dict(self.dropped),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MeterSnapshot:
        """Inverse of ``to_dict``, for reading the meter of a simulator in another process."""
        calls = [BilledCall(**item) for item in data["billed"]]
        return cls(
            requests_total=int(data["requests_total"]),
            responses_by_status={int(k): int(v) for k, v in data["responses_by_status"].items()},
            billed={call.request_id: call for call in calls},
            billed_tokens_total=int(data["billed_tokens_total"]),
            calls_by_correlation_id={
                str(k): int(v) for k, v in data["calls_by_correlation_id"].items()
            },
            timestamps=tuple(float(t) for t in data["timestamps"]),
            dropped={str(k): int(v) for k, v in data.get("dropped", {}).items()},
        )


class Meter:
    """Thread-safe counters: the server thread writes, tests and benchmarks read snapshots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests_total = 0
        self._statuses: Counter[int] = Counter()
        self._billed: dict[str, BilledCall] = {}
        self._attempts: Counter[str] = Counter()
        self._timestamps: list[float] = []
        self._dropped: Counter[str] = Counter()

    def record_request(self) -> None:
        """A request arrived on the completions route."""
        with self._lock:
            self._requests_total += 1

    def record_attempt(self, correlation_id: str) -> int:
        """A request passed the rate limiter; returns its 1-based attempt number for the key."""
        with self._lock:
            self._attempts[correlation_id] += 1
            return self._attempts[correlation_id]

    def record_accepted(self) -> None:
        """A request consumed rate-limit capacity (wall-clock time, for rate measurements)."""
        with self._lock:
            self._timestamps.append(time.time())

    def record_status(self, status: int) -> None:
        """A response with ``status`` was sent."""
        with self._lock:
            self._statuses[status] += 1

    def record_drop(self, kind: str) -> None:
        """A connection was closed without a response (``reset`` or ``timeout``)."""
        with self._lock:
            self._dropped[kind] += 1

    def bill(self, call: BilledCall) -> None:
        """Charge a completed call."""
        with self._lock:
            self._billed[call.request_id] = call

    def snapshot(self) -> MeterSnapshot:
        """A consistent copy of every counter."""
        with self._lock:
            billed = dict(self._billed)
            return MeterSnapshot(
                requests_total=self._requests_total,
                responses_by_status=dict(self._statuses),
                billed=billed,
                billed_tokens_total=sum(call.total_tokens for call in billed.values()),
                calls_by_correlation_id=dict(self._attempts),
                timestamps=tuple(self._timestamps),
                dropped=dict(self._dropped),
            )

    def clear(self) -> None:
        """Forget everything, including attempt numbers (fault draws start over)."""
        with self._lock:
            self._requests_total = 0
            self._statuses.clear()
            self._billed.clear()
            self._attempts.clear()
            self._timestamps.clear()
            self._dropped.clear()
