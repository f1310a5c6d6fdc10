"""What the simulator saw and billed, readable from any thread.

A call is billed exactly when the simulator answered 200 with a ``usage`` object, including
answers whose content is wrong on purpose; errors, rate limits, hangs and resets cost nothing.
Batch lines are billed the same way when their batch finishes (``batch_id`` set); the meter
also counts batch creates per chunk (from the batch metadata) and status polls. What is billed
never depends on the ``usage`` shape the client was shown: tests compare their ledger with
``billed_by_correlation_id`` (requests, prompt, completion and total tokens per key).
Refusals by the access checks (401, 403, 404) are counted per status and per endpoint.

Moderation calls (``POST /v1/moderations``, free) are billed too: one ``BilledCall`` per
answered 200 with 0 prompt and 0 completion tokens, cost 0 and ``endpoint``
``/v1/moderations``, so a client's ledger can be compared call for call. Legacy completions
(``POST /v1/completions``, Llama Guard's custom categories) are billed like chat calls, with
``endpoint`` ``/v1/completions``. In the JSON of ``GET /_sim/meter`` a billed item carries
``"endpoint"`` only when it is not a chat completion, so chat items keep their historical
shape; ``billed_by_endpoint`` sums calls and cost per endpoint and ``requests_by_endpoint``
counts arrivals (``requests_total`` counts every answering route).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

CHAT_ENDPOINT = "/v1/chat/completions"
MODERATIONS_ENDPOINT = "/v1/moderations"
# The legacy completions API: Llama Guard's custom-category prompts (guard_models/).
COMPLETIONS_ENDPOINT = "/v1/completions"


@dataclass(frozen=True, slots=True)
class BilledCall:
    """One billed completion."""

    request_id: str
    correlation_id: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    batch_id: str = ""
    # Of prompt_tokens: read from the prompt cache (billed at the cached price).
    cached_tokens: int = 0
    # 'default' or 'flex' (what the answer's service_tier said); batch lines have a batch_id.
    service_tier: str = "default"
    # What the simulator's own price list charged for the call, and when (epoch seconds).
    cost_nanos: int = 0
    billed_at: float = 0.0
    # Which API answered: chat completions, legacy completions, or moderations (free: no
    # tokens, no cost).
    endpoint: str = CHAT_ENDPOINT

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class KeyBill:
    """What one correlation id was billed in all."""

    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass(frozen=True, slots=True)
class EndpointBill:
    """What the calls billed on one endpoint came to."""

    calls: int
    cost_nanos: int


def _call_dict(call: BilledCall) -> dict[str, Any]:
    """A billed item as served; chat items leave out ``endpoint``, as before it existed."""
    item = asdict(call)
    if call.endpoint == CHAT_ENDPOINT:
        del item["endpoint"]
    return item


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
    batch_creates_by_chunk: dict[str, int] = field(default_factory=dict)
    batch_creates_total: int = 0
    batch_polls: int = 0
    batch_polls_rate_limited: int = 0
    files_uploaded: int = 0
    batch_create_requests: int = 0
    refusals_by_status: dict[int, int] = field(default_factory=dict)
    refusals_by_endpoint: dict[str, int] = field(default_factory=dict)
    # Arrivals per answering route (chat, legacy completions, moderations); they sum to
    # requests_total.
    requests_by_endpoint: dict[str, int] = field(default_factory=dict)

    @property
    def billed_batch_tokens(self) -> int:
        """Tokens billed for batch lines (a subset of ``billed_tokens_total``)."""
        return sum(call.total_tokens for call in self.billed.values() if call.batch_id)

    @property
    def billed_cost_nanos(self) -> int:
        """What every billed call cost at the simulator's own prices."""
        return sum(call.cost_nanos for call in self.billed.values())

    @property
    def billed_prompt_tokens(self) -> int:
        """Sum of billed prompt tokens."""
        return sum(call.prompt_tokens for call in self.billed.values())

    @property
    def billed_completion_tokens(self) -> int:
        """Sum of billed completion tokens."""
        return sum(call.completion_tokens for call in self.billed.values())

    @property
    def billed_by_endpoint(self) -> dict[str, EndpointBill]:
        """Billed calls and their cost per endpoint (endpoints without calls left out)."""
        sums: dict[str, list[int]] = {}
        for call in self.billed.values():
            row = sums.setdefault(call.endpoint, [0, 0])
            row[0] += 1
            row[1] += call.cost_nanos
        return {endpoint: EndpointBill(n, cost) for endpoint, (n, cost) in sums.items()}

    @property
    def billed_by_correlation_id(self) -> dict[str, KeyBill]:
        """Billed requests and tokens per correlation id (batch lines included)."""
        sums: dict[str, list[int]] = {}
        for call in self.billed.values():
            row = sums.setdefault(call.correlation_id, [0, 0, 0])
            row[0] += 1
            row[1] += call.prompt_tokens
            row[2] += call.completion_tokens
        return {key: KeyBill(n, p, c, p + c) for key, (n, p, c) in sums.items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as served by ``GET /_sim/meter`` (with derived sums for scripts)."""
        return {
            "requests_total": self.requests_total,
            "responses_by_status": {str(k): v for k, v in self.responses_by_status.items()},
            "billed": [_call_dict(call) for call in self.billed.values()],
            "billed_tokens_total": self.billed_tokens_total,
            "billed_prompt_tokens": self.billed_prompt_tokens,
            "billed_completion_tokens": self.billed_completion_tokens,
            "billed_cost_nanos": self.billed_cost_nanos,
            "billed_by_endpoint": {
                endpoint: asdict(bill) for endpoint, bill in self.billed_by_endpoint.items()
            },
            "billed_by_correlation_id": {
                key: asdict(bill) for key, bill in self.billed_by_correlation_id.items()
            },
            "calls_by_correlation_id": dict(self.calls_by_correlation_id),
            "timestamps": list(self.timestamps),
            "dropped": dict(self.dropped),
            "batch_creates_by_chunk": dict(self.batch_creates_by_chunk),
            "batch_creates_total": self.batch_creates_total,
            "batch_polls": self.batch_polls,
            "batch_polls_rate_limited": self.batch_polls_rate_limited,
            "files_uploaded": self.files_uploaded,
            "batch_create_requests": self.batch_create_requests,
            "refusals_by_status": {str(k): v for k, v in self.refusals_by_status.items()},
            "refusals_by_endpoint": dict(self.refusals_by_endpoint),
            "requests_by_endpoint": dict(self.requests_by_endpoint),
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
            batch_creates_by_chunk={
                str(k): int(v) for k, v in data.get("batch_creates_by_chunk", {}).items()
            },
            batch_creates_total=int(data.get("batch_creates_total", 0)),
            batch_polls=int(data.get("batch_polls", 0)),
            batch_polls_rate_limited=int(data.get("batch_polls_rate_limited", 0)),
            files_uploaded=int(data.get("files_uploaded", 0)),
            batch_create_requests=int(data.get("batch_create_requests", 0)),
            refusals_by_status={
                int(k): int(v) for k, v in data.get("refusals_by_status", {}).items()
            },
            refusals_by_endpoint={
                str(k): int(v) for k, v in data.get("refusals_by_endpoint", {}).items()
            },
            requests_by_endpoint={
                str(k): int(v) for k, v in data.get("requests_by_endpoint", {}).items()
            },
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
        self._creates: Counter[str] = Counter()
        self._creates_total = 0
        self._polls = 0
        self._polls_limited = 0
        self._uploads = 0
        self._create_requests = 0
        self._refusals: Counter[int] = Counter()
        self._refusals_at: Counter[str] = Counter()
        self._requests_at: Counter[str] = Counter()

    def record_refusal(self, status: int, endpoint: str) -> None:
        """An access check refused a request (``endpoint``: 'POST /v1/batches' and the like)."""
        with self._lock:
            self._refusals[status] += 1
            self._refusals_at[endpoint] += 1

    def record_batch_create_request(self) -> None:
        """A ``POST /v1/batches`` arrived (created, refused or hung alike)."""
        with self._lock:
            self._create_requests += 1

    def record_batch_create(self, chunk_id: str) -> None:
        """A batch was created; ``chunk_id`` from its metadata ('' when absent)."""
        with self._lock:
            self._creates_total += 1
            if chunk_id:
                self._creates[chunk_id] += 1

    def record_batch_poll(self, rate_limited: bool) -> None:
        """A batch retrieve or list request, and whether it was answered 429."""
        with self._lock:
            self._polls += 1
            self._polls_limited += int(rate_limited)

    def record_upload(self) -> None:
        """A file was uploaded."""
        with self._lock:
            self._uploads += 1

    def record_request(self, endpoint: str = CHAT_ENDPOINT) -> None:
        """A request arrived on an answering route (chat completions or moderations)."""
        with self._lock:
            self._requests_total += 1
            self._requests_at[endpoint] += 1

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
                batch_creates_by_chunk=dict(self._creates),
                batch_creates_total=self._creates_total,
                batch_polls=self._polls,
                batch_polls_rate_limited=self._polls_limited,
                files_uploaded=self._uploads,
                batch_create_requests=self._create_requests,
                refusals_by_status=dict(self._refusals),
                refusals_by_endpoint=dict(self._refusals_at),
                requests_by_endpoint=dict(self._requests_at),
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
            self._creates.clear()
            self._creates_total = 0
            self._polls = self._polls_limited = self._uploads = self._create_requests = 0
            self._refusals.clear()
            self._refusals_at.clear()
            self._requests_at.clear()
