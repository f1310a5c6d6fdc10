"""Files and Batches over ``httpx.AsyncClient``: timeouts on every call, typed failures.

What an error answer means comes from the one taxonomy both dispatch modes share
(``models.errors.classify``):
- ``RateLimited`` (429): nothing happened; wait (Retry-After) and ask again. A 429 on a
  status call says nothing about the batch, so it is never read as "not ready".
- ``Unsure`` (timeout, connection error, 5xx, 408, 409): the call may or may not have taken
  effect; idempotent calls are repeated, a create is first looked up by its metadata.
- ``TokenLimited`` (the enqueued-token limit): wait until earlier batches end.
- ``Refused`` (other 4xx): the request itself is wrong.
- ``RunFatalError`` (401, 403, 404, a redirect, no quota): nothing will work with this
  configuration; the run stops and every chunk stays as it is for the next run.
Messages are the scrubbed summaries of ``models.openai_wire``: never the key, never a post
(``echoes``: the texts a call carries, withheld if the provider quotes them back).
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, BinaryIO, TypeVar

import httpx
from pydantic import ValidationError

from backfill_assets import __version__
from backfill_assets.config.variables import HttpSettings, ModelSettings
from backfill_assets.domain.work.outcomes import RetryPolicy
from backfill_assets.providers.batch_wire import ENDPOINT, BatchObject, BatchPage
from backfill_assets.providers.bounded_body import (
    ACCEPT_ENCODING,
    BadBody,
    read_capped,
    read_head,
    stream_to,
)
from backfill_assets.providers.models.base import RunFatalError
from backfill_assets.providers.models.errors import Scope, classify, run_fatal_hint
from backfill_assets.providers.models.openai_wire import (
    error_code,
    error_summary,
    loads_or_none,
    retry_after_seconds,
)
from backfill_assets.providers.provider_text import UNCHECKED, safe_id

T = TypeVar("T")
# What a call's error message must not quote: texts, or a coroutine reading them (only run if
# the call fails) that returns None when they cannot be known (then no message is kept).
Echoes = Sequence[str] | Callable[[], Awaitable[Sequence[str] | None]]
_USER_AGENT = f"backfill-moderation/{__version__} batch (+httpx)"
# A batch object or a page of them is a few KiB; the start of an error body says enough.
ANSWER_MAX_BYTES = 8 * 1024 * 1024
ERROR_HEAD_BYTES = 64 * 1024
_RNG = random.Random()


@dataclass(frozen=True)
class BatchEndpoint:
    """An OpenAI-compatible API with ``/files`` and ``/batches`` under ``base_url``."""

    base_url: str
    model: str
    # Never printed: a repr ends up in logs and tracebacks.
    api_key: str = field(default="", repr=False)
    # The groups the settings parsed: prices and the token parameter; timeouts and the
    # longest Retry-After honoured.
    settings: ModelSettings = field(default_factory=ModelSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    # Uploads and downloads of files up to 200 MB need more than a status call.
    transfer_timeout_s: float = 600.0


class BatchApiError(Exception):
    """A Files/Batches call that did not succeed."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class RateLimited(BatchApiError):
    """429: slow down; ``retry_after`` seconds if the provider said."""

    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__(message, status=429, code="rate_limit_exceeded")
        self.retry_after = retry_after


class Unsure(BatchApiError):
    """No answer (timeout, connection) or a 5xx: the call may have taken effect."""


class Refused(BatchApiError):
    """A 4xx about the request itself: repeating the same request will not help."""


class TokenLimited(Refused):
    """The organisation's enqueued-token limit: no new batch until earlier ones end."""


class BatchClient:
    """One provider endpoint's Files and Batches APIs."""

    def __init__(
        self,
        endpoint: BatchEndpoint,
        transport: httpx.AsyncBaseTransport | None = None,
        retry_base_s: float = 1.0,
    ) -> None:
        self._api_key = endpoint.api_key
        # Idempotent calls (status, list, download, upload by name) repeat on 429s and unsure
        # failures with the synchronous calls' back-off, up to 8 attempts and 60 s apart.
        self.retries = RetryPolicy(
            max_attempts=8,
            retry_base_seconds=retry_base_s,
            retry_max_seconds=60.0,
            retry_after_max_seconds=endpoint.http.retry_after_max_seconds,
        )
        self.retry_after_max_seconds = endpoint.http.retry_after_max_seconds
        headers = {"user-agent": _USER_AGENT, "accept-encoding": ACCEPT_ENCODING}
        if endpoint.api_key:
            headers["authorization"] = f"Bearer {endpoint.api_key}"
        timeout = httpx.Timeout(
            connect=endpoint.http.connect_timeout_s,
            read=endpoint.http.read_timeout_s,
            write=endpoint.http.read_timeout_s,
            pool=endpoint.http.read_timeout_s,
        )
        self._transfer = httpx.Timeout(
            connect=endpoint.http.connect_timeout_s,
            read=endpoint.transfer_timeout_s,
            write=endpoint.transfer_timeout_s,
            pool=endpoint.http.read_timeout_s,
        )
        self._base_url = endpoint.base_url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=endpoint.base_url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        """Close pooled connections."""
        await self._client.aclose()

    async def _call(
        self, method: str, path: str, echoes: Echoes = (), **kwargs: Any
    ) -> httpx.Response:
        try:
            async with self._client.stream(method, path, **kwargs) as streamed:
                if 200 <= streamed.status_code < 300:
                    body = await read_capped(streamed, ANSWER_MAX_BYTES)
                else:
                    body = await read_head(streamed, ERROR_HEAD_BYTES)
        except BadBody as exc:
            raise Unsure(f"{method} {path}: {exc}") from None
        except httpx.TimeoutException as exc:
            raise Unsure(f"{method} {path}: timeout ({type(exc).__name__})") from None
        except httpx.RequestError as exc:
            raise Unsure(f"{method} {path}: connection error ({type(exc).__name__})") from None
        return await self._checked(_read(streamed, body), method, path, echoes)

    async def _checked(
        self, response: httpx.Response, method: str, path: str, echoes: Echoes
    ) -> httpx.Response:
        """``response`` if it is a 2xx, else the error it means (one taxonomy with sync)."""
        status = response.status_code
        if 200 <= status < 300:
            return response
        texts = await echoes() if callable(echoes) else echoes
        summary, message = error_summary(
            status,
            response.content,
            response.headers.get("content-type", ""),
            echoes=texts or (),
            secrets=[self._api_key] if self._api_key else [],
        )
        if texts is None:
            summary = f"HTTP {status}: {UNCHECKED}"
        code = error_code(loads_or_none(response.content))
        scope = classify(status, code)
        if scope is Scope.RUN:
            endpoint = f"{method} {self._base_url}{path}"
            raise RunFatalError(
                f"{summary} from {endpoint} ({run_fatal_hint(status)})",
                status=status,
                endpoint=endpoint,
            )
        if scope is Scope.TOKEN_LIMIT:
            raise TokenLimited(summary, status=status, code=code)
        if scope in (Scope.RETRY, Scope.CAPACITY):
            if status == 429:
                wait = retry_after_seconds(response.headers, message)
                # A bogus Retry-After (days) must not freeze the run: bounded like sync's.
                raise RateLimited(
                    summary, None if wait is None else min(wait, self.retry_after_max_seconds)
                )
            raise Unsure(summary, status=status, code=code)
        raise Refused(summary, status=status, code=code)

    async def upload(self, filename: str, content: bytes, echoes: Echoes = ()) -> str:
        """Upload a batch input file; returns its file id."""
        response = await self._call(
            "POST",
            "/files",
            echoes,
            data={"purpose": "batch"},
            files={"file": (filename, content, "application/jsonl")},
            timeout=self._transfer,
        )
        data = loads_or_none(response.content)
        file_id = safe_id(data.get("id")) if isinstance(data, dict) else None
        if file_id is None:
            # The file may exist: a new upload makes another one, which costs nothing.
            raise Unsure(f"POST /files: HTTP {response.status_code} answer holds no file id")
        return file_id

    async def create(
        self, file_id: str, metadata: dict[str, str], echoes: Echoes = (), endpoint: str = ENDPOINT
    ) -> BatchObject:
        """Create a batch over an uploaded file (not idempotent: see ``find``); ``endpoint``
        is the lines' ``url`` (chat completions, or moderations)."""
        body = {
            "input_file_id": file_id,
            "endpoint": endpoint,
            "completion_window": "24h",
            "metadata": metadata,
        }
        response = await self._call("POST", "/batches", echoes, json=body)
        return _parsed(response, BatchObject, "POST /batches")

    async def retrieve(self, batch_id: str) -> BatchObject:
        """A batch's current state."""
        response = await self._call("GET", f"/batches/{batch_id}")
        return _parsed(response, BatchObject, "GET /batches/{id}")

    async def cancel(self, batch_id: str) -> BatchObject:
        """Ask the provider to cancel a batch."""
        response = await self._call("POST", f"/batches/{batch_id}/cancel")
        return _parsed(response, BatchObject, "POST /batches/{id}/cancel")

    async def content(self, file_id: str, out: BinaryIO, cap: int) -> int:
        """A file's bytes (batch output or error file) written to ``out``, decoded and streamed:
        never more than ``cap`` bytes (``BodyTooLarge``). Its size."""
        path = f"/files/{file_id}/content"
        try:
            async with self._client.stream("GET", path, timeout=self._transfer) as streamed:
                if not 200 <= streamed.status_code < 300:
                    head = await read_head(streamed, ERROR_HEAD_BYTES)
                    await self._checked(_read(streamed, head), "GET", path, ())
                out.seek(0)
                out.truncate()
                return await stream_to(streamed, out, cap)
        except httpx.TimeoutException as exc:
            raise Unsure(f"GET {path}: timeout ({type(exc).__name__})") from None
        except httpx.RequestError as exc:
            raise Unsure(f"GET {path}: connection error ({type(exc).__name__})") from None

    async def page(self, after: str | None, limit: int = 100) -> BatchPage:
        """One page of batches, newest first."""
        params: dict[str, str | int] = {"limit": limit}
        if after:
            params["after"] = after
        response = await self._call("GET", "/batches", params=params)
        return _parsed(response, BatchPage, "GET /batches")

    async def find(self, key: str, value: str, since: datetime) -> BatchObject | None:
        """The newest batch whose metadata has ``key == value``, created after ``since``.

        Lists newest first and stops at batches older than ``since`` (the chunk's intent), so
        an organisation's long batch history is not read to the end.
        """
        floor = since.replace(tzinfo=UTC).timestamp() - 300  # clock skew margin
        after: str | None = None
        while True:
            page = await retry(
                functools.partial(self.page, after), what="list batches", policy=self.retries
            )
            for batch in page.data:
                if (batch.metadata or {}).get(key) == value:
                    return batch
            older = [b for b in page.data if b.created_at is not None and b.created_at < floor]
            if not page.has_more or not page.data or older:
                return None
            after = page.last_id or page.data[-1].id


M = TypeVar("M", BatchObject, BatchPage)


def _read(streamed: httpx.Response, body: bytes) -> httpx.Response:
    """A streamed response with the body read so far (already decoded) as its content."""
    headers = [(k, v) for k, v in streamed.headers.multi_items() if k.lower() != "content-encoding"]
    return httpx.Response(
        streamed.status_code, headers=headers, content=body, request=streamed.request
    )


def _parsed(response: httpx.Response, model: type[M], what: str) -> M:
    """A 2xx answer as ``model``; one that is not (garbage, huge numbers, ids that are not ids)
    is a call whose effect is unknown, never an exception out of the run."""
    try:
        return model.model_validate_json(response.content)
    except (ValidationError, ValueError, RecursionError):
        raise Unsure(
            f"{what}: HTTP {response.status_code} answer is not a {model.__name__}"
        ) from None


async def retry(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    policy: RetryPolicy,
    log: Callable[[str], None] = lambda _m: None,
) -> T:
    """Repeat an idempotent call through 429s and unsure failures, waiting as ``policy`` says
    (the back-off of synchronous calls: jittered, a provider's Retry-After honoured)."""
    for attempt in range(1, policy.max_attempts + 1):
        try:
            return await call()
        except (RateLimited, Unsure) as exc:
            if policy.exhausted(attempt):
                raise
            after = exc.retry_after if isinstance(exc, RateLimited) else None
            wait = policy.delay(attempt, after, _RNG)
            log(f"{what}: {exc}; retrying in {wait:.1f}s")
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")
