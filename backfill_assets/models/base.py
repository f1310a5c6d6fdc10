"""The model adapter interface every provider implements."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One post of one tenant, ready to send."""

    key: str
    tenant_id: str
    post_id: str
    attempt: int
    model: str
    messages: list[dict[str, str]]
    max_output_tokens: int
    estimated_tokens: int


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """The provider's raw answer and what it billed; parsing happens later, in the pipeline."""

    raw_text: str
    tokens_in: int
    tokens_out: int
    request_id: str
    usage_reported: bool = True
    latency_ms: float = 0.0
    cost: float | None = None


class ModelCallError(Exception):
    """A call that produced no usable response; ``billed`` when the provider still charged."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.request_id = request_id


class RetriableError(ModelCallError):
    """429, 408/409, 5xx, timeouts, connection errors: try again after a back-off."""


class TransportRejected(ModelCallError):
    """Other 4xx: the request itself is wrong; never retried."""


@dataclass
class AdapterStats:
    """Counters an adapter exposes for run metadata."""

    calls: int = 0
    rate_limited: int = 0
    latencies_ms: list[float] = field(default_factory=list)


class ModelAdapter(abc.ABC):
    """Sends one request at a time; concurrency, retries and booking live in ``dispatch``."""

    name: str = "adapter"

    def __init__(self) -> None:
        self.stats = AdapterStats()

    @abc.abstractmethod
    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send one request; raise ``RetriableError`` or ``TransportRejected`` on failure."""

    def cost_of(self, model: str, tokens_in: int, tokens_out: int) -> float:
        """Cost in USD of a call; adapters with a price table override this."""
        return 0.0

    async def aclose(self) -> None:
        """Release connections."""
        return None
