"""What a provider's error answer means, in one table (pure). Sync and batch paths import it.

Errors have scopes (see ``Scope``): a key-level error ends one key, a provider-level error
pauses and retries, a run-level error stops the run and leaves every key pending, and the
enqueued-token limit of a Batch API means "wait for capacity".
"""

from __future__ import annotations

import enum


class Scope(enum.StrEnum):
    """Who an error answer is about, and so what happens next."""

    # The request itself is wrong (400, 413, 422, ...): the key ends ``transport_rejected``.
    KEY = "key"
    # The provider is busy or broken (429, 408, 409, 5xx, no answer): pause and retry.
    RETRY = "retry"
    # Our configuration is wrong (401, 403, 404, a redirect, no quota): stop the run, send
    # nothing more, leave every key pending for a run with the fix.
    RUN = "run"
    # Batch API: the organisation's enqueued-token limit; wait until earlier batches end.
    TOKEN_LIMIT = "token_limit"
    # The flex tier has no capacity now (OpenAI: 429 "resource unavailable"; Groq: 498
    # ``capacity_exceeded``): a provider-level pause. Retried without counting the attempt,
    # never dead-lettered, and no rate signal: the account's limit did not change.
    CAPACITY = "capacity"


# Statuses that say "try again later" about the provider, not about the request.
RETRIABLE_STATUSES = frozenset({408, 409, 429})
# Statuses that say "your key, permission, model or URL is wrong": no request will succeed.
RUN_FATAL_STATUSES = frozenset({401, 403, 404})
# ``error.code`` values, whatever the status, that decide the scope on their own.
TOKEN_LIMIT_CODES = frozenset({"token_limit_exceeded"})
CAPACITY_CODES = frozenset({"resource_unavailable", "capacity_exceeded"})
CAPACITY_STATUSES = frozenset({498})
_CAPACITY_WORDS = ("resource unavailable", "resource_unavailable", "capacity")
RUN_FATAL_CODES = frozenset(
    {
        "invalid_api_key",
        "insufficient_quota",  # OpenAI answers 429 with this when billing is exhausted
        "model_not_found",
        "billing_hard_limit_reached",
        "account_deactivated",
        "unsupported_country_region_territory",
    }
)


def classify(status: int | None, code: str | None = None, message: str = "") -> Scope:
    """The scope of an error answer (``status`` None: no answer at all, e.g. a timeout).

    A 429 is a capacity pause only when its code or message says so: a plain 429 stays a
    rate-limit signal."""
    if code in TOKEN_LIMIT_CODES:
        return Scope.TOKEN_LIMIT
    if code in CAPACITY_CODES or status in CAPACITY_STATUSES:
        return Scope.CAPACITY
    if status == 429 and code is None and any(w in message.lower() for w in _CAPACITY_WORDS):
        return Scope.CAPACITY
    if code in RUN_FATAL_CODES:
        return Scope.RUN
    if status is None:
        return Scope.RETRY
    if status in RUN_FATAL_STATUSES or 300 <= status < 400:
        return Scope.RUN
    if status in RETRIABLE_STATUSES or status >= 500:
        return Scope.RETRY
    return Scope.KEY


def run_fatal_hint(status: int | None) -> str:
    """What an operator should check for a run-level error (never names the key's value)."""
    if status == 401:
        return "the API key was refused: check BACKFILL_MODEL_API_KEY"
    if status == 403:
        return "the key lacks permission for this model or endpoint"
    if status == 404:
        return "unknown model or wrong base URL: check BACKFILL_MODEL and BACKFILL_MODEL_BASE_URL"
    if status is not None and 300 <= status < 400:
        return "the endpoint redirects: check BACKFILL_MODEL_BASE_URL"
    return "the provider refused the account (quota or billing)"
