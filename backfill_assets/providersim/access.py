"""Who may call: API key (401), a forbidden caller (403) and unknown models (404).

The bodies copy OpenAI's wording. A wrong key is echoed the way OpenAI echoes it: the first 8
characters, one ``*`` per hidden character, then the last 4 (``sk-zhj0s****...CMuq``); keys of
12 characters or fewer are echoed whole, as OpenAI does with short strings. So an error message
can hold part of a secret, and a client must not log provider messages verbatim.

Every refusal made here is counted by the meter per status and endpoint (``refusals_*``).
"""

from __future__ import annotations

import hmac

from backfill_assets.providersim.billing.meter import Meter
from backfill_assets.providersim.config import FaultKind, ForbidMode, SimConfig
from backfill_assets.providersim.http import Request
from backfill_assets.providersim.wire import ApiError

_KEY_HINT = "You can find your API key at https://platform.openai.com/account/api-keys."
_SHOWN_HEAD, _SHOWN_TAIL = 8, 4


def masked_key(token: str) -> str:
    """The key as OpenAI quotes it in a 401: head, one asterisk per hidden character, tail."""
    if len(token) <= _SHOWN_HEAD + _SHOWN_TAIL:
        return token
    hidden = len(token) - _SHOWN_HEAD - _SHOWN_TAIL
    return token[:_SHOWN_HEAD] + "*" * hidden + token[-_SHOWN_TAIL:]


def unauthorized(token: str | None) -> ApiError:
    """401 ``invalid_api_key``: no bearer token, or a wrong one (echoed masked)."""
    if not token:
        return ApiError(
            401,
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            code="invalid_api_key",
        )
    return ApiError(
        401, f"Incorrect API key provided: {masked_key(token)}. {_KEY_HINT}", code="invalid_api_key"
    )


def forbidden(mode: ForbidMode) -> ApiError:
    """403 for ``mode``: OpenAI's region block, or a gateway's missing permission."""
    if mode == "permission":
        return ApiError(
            403,
            "You have insufficient permissions for this operation. Check that your key "
            "is allowed to use this endpoint and model.",
            error_type="permission_error",
            code="insufficient_permissions",
        )
    return ApiError(
        403,
        "Country, region, or territory not supported",
        error_type="request_forbidden",
        code="unsupported_country_region_territory",
    )


def model_not_found(model: str) -> ApiError:
    """404 ``model_not_found`` as OpenAI answers an unknown or inaccessible model."""
    return ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        code="model_not_found",
    )


def refusal(kind: FaultKind, model: str, token: str | None, mode: ForbidMode) -> ApiError:
    """The error for a ``401``/``403``/``404`` fault (a 403 fault uses ``mode``, else region)."""
    if kind == "401":
        return unauthorized(token)
    if kind == "403":
        return forbidden(mode if mode != "off" else "region")
    if kind == "404":
        return model_not_found(model)
    raise ValueError(f"{kind!r} is not a refusal")


def bearer_token(request: Request) -> str | None:
    """The bearer token of a request, or None."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class Access:
    """Checks every /v1 route runs first, in the order a provider's edge runs them."""

    def __init__(self, config: SimConfig, meter: Meter) -> None:
        self._config = config
        self._meter = meter

    def _refuse(self, error: ApiError, endpoint: str) -> ApiError:
        self._meter.record_refusal(error.status, endpoint)
        return error

    def check(self, request: Request, endpoint: str) -> None:
        """401 without the configured key, then 403 in a ``forbid`` mode; raises ``ApiError``."""
        expected = self._config.api_key
        if expected is not None:
            token = bearer_token(request)
            if token is None or not hmac.compare_digest(token.encode(), expected.encode()):
                raise self._refuse(unauthorized(token), endpoint)
        if self._config.forbid != "off":
            raise self._refuse(forbidden(self._config.forbid), endpoint)

    def check_model(self, model: str, endpoint: str) -> None:
        """404 for a model outside ``models`` when ``strict_models`` is set."""
        if self._config.strict_models and model not in self._config.models:
            raise self._refuse(model_not_found(model), endpoint)

    def fault(self, kind: FaultKind, request: Request, model: str, endpoint: str) -> ApiError:
        """The refusal a ``401``/``403``/``404`` fault answers with (counted like real ones)."""
        error = refusal(kind, model, bearer_token(request), self._config.forbid)
        return self._refuse(error, endpoint)
