"""The model adapter interface every provider implements."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from backfill_assets.domain.money.prices import Tier
from backfill_assets.domain.policy.output_gate import OutputContract
from backfill_assets.providers.ratelimit import EndpointLimiter


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
    # A cheap guess for pacing (rate limiter), and the most the call can bill (budget).
    estimated_tokens: int
    # What the answer must be: the policy's labels and rules (its JSON schema is sent).
    contract: OutputContract
    bound_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """The provider's raw answer and what it billed; parsing happens later, in the pipeline.

    ``usage_shape``: ``split`` (prompt and completion reported), ``total`` (only the total:
    booked in ``tokens_in``) or ``missing`` (no usage: the call's bound was booked instead).
    """

    raw_text: str
    tokens_in: int
    tokens_out: int
    request_id: str
    usage_shape: str = "split"
    latency_ms: float = 0.0
    # Nano-dollars the adapter priced the call at (None: the dispatcher prices it).
    cost_nanos: int | None = None
    # Of tokens_in: read from and written to the provider's prompt cache.
    tokens_cached: int = 0
    tokens_cache_written: int = 0
    # Of tokens_out: reasoning tokens, where the provider reports them.
    tokens_reasoning: int = 0
    # Where the answer was found, when a server may put it in more than one field (safeguard:
    # ``content``, ``reasoning_content``, ``reasoning_json``); '' otherwise.
    answer_from: str = ""
    # The answer's tokens and their log-probabilities, when the server sent them: the label's
    # probability is read from them (``domain/policy/label_probability.py``).
    logprobs: tuple[tuple[str, float], ...] | None = None
    # The tier the provider says it billed, and the price the cost was booked at (JSON of
    # ``core.prices.BookedPrice``; '' when the adapter did not price the call).
    service_tier: str = Tier.STANDARD.value
    price_booked: str = ""
    # The model had no price (BACKFILL_ALLOW_UNPRICED): the cost is unknown, not 0.
    cost_unknown: bool = False

    @property
    def usage_reported(self) -> bool:
        """False when the provider sent no usage and the bound was booked."""
        return self.usage_shape != "missing"


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


class CapacityUnavailable(RetriableError):
    """The tier asked for had no capacity (flex): retried later, never counted as an attempt."""


class TransportRejected(ModelCallError):
    """Other 4xx: the request itself is wrong; never retried."""


class RunFatalError(ModelCallError):
    """401, 403, 404, a redirect, no quota: nothing will succeed with this configuration.

    The run stops, sends nothing more and leaves every key pending. ``endpoint`` names where
    the answer came from; the message never holds the API key.
    """

    def __init__(
        self, message: str, *, status: int | None, endpoint: str, request_id: str | None = None
    ) -> None:
        super().__init__(message, status=status, request_id=request_id)
        self.endpoint = endpoint


class NotSent(ModelCallError):
    """The call was stopped before it was sent (the run is stopping); nothing was billed."""


@dataclass
class AdapterStats:
    """Counters an adapter exposes for run metadata."""

    calls: int = 0
    rate_limited: int = 0
    # Answers that said the tier had no capacity (flex).
    capacity_unavailable: int = 0
    latencies_ms: list[float] = field(default_factory=list)


class ModelAdapter(abc.ABC):
    """Sends one request at a time; concurrency, retries and booking live in ``dispatch``."""

    name: str = "adapter"

    def __init__(self) -> None:
        self.stats = AdapterStats()
        self.halted: str | None = None

    def halt(self, reason: str) -> None:
        """Send nothing more: calls not yet sent raise ``NotSent`` (the run is stopping)."""
        self.halted = self.halted or reason

    def check_not_halted(self) -> None:
        """Raise ``NotSent`` if the adapter was halted; call right before sending."""
        if self.halted is not None:
            raise NotSent(f"not sent: {self.halted}")

    @abc.abstractmethod
    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send one request; raise ``RetriableError`` or ``TransportRejected`` on failure."""

    def cost_of(self, model: str, tokens_in: int, tokens_out: int) -> int:
        """Nano-dollars of a call; adapters with a price table override this."""
        return 0

    def cost_bound(self, model: str, prompt_tokens: int, output_tokens: int) -> int | None:
        """The most nano-dollars a call of at most these tokens can be booked at (None: the
        model has no price); what a dollar budget reserves."""
        return self.cost_of(model, prompt_tokens, output_tokens)

    def rate_limit(self) -> tuple[str, EndpointLimiter] | None:
        """The account this adapter's limit belongs to (an id, never a secret) and its
        limiter, when the limit is one other processes share; None for in-process fakes."""
        return None

    async def aclose(self) -> None:
        """Release connections."""
        return None
