"""Routes of the Files and Batch APIs; retrieve and list share a status-poll rate limit.

Every route runs the access checks first (401, 403). ``POST /v1/batches`` then refuses an input
file naming a model outside ``models`` (404, with ``strict_models``), answers the first
``batch_create_token_limit_count`` creates 400 ``token_limit_exceeded``, and for the first
``batch_create_hang_count`` batches it creates withholds the answer for ``hang_seconds`` and
closes the connection: the batch exists and runs, but the client never learns its id.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import parse_qs

from backfill_assets.providersim.access import Access
from backfill_assets.providersim.batch.files import FileStore
from backfill_assets.providersim.batch.jobs import BatchStore
from backfill_assets.providersim.batch.lines import models_named
from backfill_assets.providersim.billing.meter import Meter
from backfill_assets.providersim.config import SimConfig
from backfill_assets.providersim.http import Drop, Reply, Request, Response, Router
from backfill_assets.providersim.limits import TokenBucket, retry_after_headers
from backfill_assets.providersim.wire import ApiError

_CREATE = "POST /v1/batches"


def _token_limit_refusal(model: str) -> ApiError:
    return ApiError(
        400,
        f"Enqueued token limit reached for {model} in organization org-providersim. Please try "
        "again once some in_progress batches have been completed.",
        code="token_limit_exceeded",
    )


class BatchApi:
    """Handlers for ``/v1/files`` and ``/v1/batches`` (state lives on the server's loop)."""

    def __init__(self, config: SimConfig, meter: Meter, access: Access) -> None:
        self._config = config
        self._meter = meter
        self._access = access
        self._creates_admitted = 0
        self.files = FileStore(config.batch_max_file_bytes)
        self.batches = BatchStore(config, meter, self.files)
        self._polls = (
            TokenBucket(config.batch_poll_rpm, config.burst_seconds, time.monotonic)
            if config.batch_poll_rpm
            else None
        )

    def register(self, router: Router) -> None:
        """Add the routes."""
        router.add("POST", "/v1/files", self.upload_file)
        router.add("GET", "/v1/files/{file_id}", self.retrieve_file)
        router.add("GET", "/v1/files/{file_id}/content", self.file_content)
        router.add("POST", "/v1/batches", self.create_batch)
        router.add("GET", "/v1/batches", self.list_batches)
        router.add("GET", "/v1/batches/{batch_id}", self.retrieve_batch)
        router.add("POST", "/v1/batches/{batch_id}/cancel", self.cancel_batch)

    def reset(self) -> None:
        """Refill the poll bucket (jobs and files stay: they are the provider's state)."""
        if self._polls is not None:
            self._polls.fill()

    def _poll_admitted(self) -> None:
        limited = False
        if self._polls is not None:
            wait = self._polls.wait_for(1)
            limited = wait > 0.0
            if limited:
                self._meter.record_batch_poll(True)
                raise ApiError(
                    429,
                    "Too many requests to the batches endpoint. Please slow down.",
                    error_type="requests",
                    code="rate_limit_exceeded",
                    headers=retry_after_headers(wait, self._config.retry_after_format),
                )
            self._polls.take(1)
        self._meter.record_batch_poll(limited)

    async def upload_file(self, request: Request) -> Reply:
        """``POST /v1/files`` (multipart: ``purpose`` and ``file``)."""
        try:
            self._access.check(request, "POST /v1/files")
            stored = self.files.upload(request.headers.get("content-type", ""), request.body)
        except ApiError as exc:
            return _error(exc)
        self._meter.record_upload()
        return Response.json(200, stored.to_json())

    async def retrieve_file(self, request: Request) -> Reply:
        """``GET /v1/files/{file_id}``."""
        try:
            self._access.check(request, "GET /v1/files/{file_id}")
            return Response.json(200, self.files.get(request.params["file_id"]).to_json())
        except ApiError as exc:
            return _error(exc)

    async def file_content(self, request: Request) -> Reply:
        """``GET /v1/files/{file_id}/content``: the raw bytes."""
        try:
            self._access.check(request, "GET /v1/files/{file_id}/content")
            self.batches.advance()
            stored = self.files.get(request.params["file_id"])
        except ApiError as exc:
            return _error(exc)
        return Response(200, stored.content, {"content-type": "application/octet-stream"})

    def _file_models(self, body: Any) -> list[str]:
        if not isinstance(body, dict):
            return []
        try:
            content = self.files.get(str(body.get("input_file_id"))).content
            return models_named(content, body.get("endpoint"))
        except ApiError:
            return []  # the create itself answers the unknown file

    async def create_batch(self, request: Request) -> Reply:
        """``POST /v1/batches``."""
        self._meter.record_batch_create_request()
        try:
            self._access.check(request, _CREATE)
            try:
                body = json.loads(request.body)
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                raise ApiError(400, "We could not parse the JSON body of your request.") from None
            if self._config.strict_models:
                for model in self._file_models(body):
                    self._access.check_model(model, _CREATE)
            self._creates_admitted += 1
            if self._creates_admitted <= self._config.batch_create_token_limit_count:
                models = self._file_models(body)
                raise _token_limit_refusal(models[0] if models else "unknown")
            batch = self.batches.create(body)
        except ApiError as exc:
            return _error(exc)
        if batch.index < self._config.batch_create_hang_count:
            # Created and running, but the answer never arrives: the client times out.
            await asyncio.sleep(self._config.hang_seconds)
            self._meter.record_drop("batch_create")
            return Drop(reset=False)
        return Response.json(200, self.batches.to_json(batch))

    async def retrieve_batch(self, request: Request) -> Reply:
        """``GET /v1/batches/{batch_id}`` (rate-limited like a status endpoint)."""
        try:
            self._access.check(request, "GET /v1/batches/{batch_id}")
            self._poll_admitted()
            batch = self.batches.get(request.params["batch_id"])
        except ApiError as exc:
            return _error(exc)
        return Response.json(200, self.batches.to_json(batch))

    async def list_batches(self, request: Request) -> Reply:
        """``GET /v1/batches?limit=&after=``, newest first, with each batch's metadata."""
        query = parse_qs(request.query)
        try:
            self._access.check(request, "GET /v1/batches")
            self._poll_admitted()
            limit = int(query.get("limit", ["20"])[0])
            if not 1 <= limit <= 100:
                raise ValueError
        except ApiError as exc:
            return _error(exc)
        except ValueError:
            return _error(ApiError(400, "limit must be an integer from 1 to 100.", param="limit"))
        page, more = self.batches.page(query.get("after", [None])[0], limit)
        data = [self.batches.to_json(b) for b in page]
        return Response.json(
            200,
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": more,
            },
        )

    async def cancel_batch(self, request: Request) -> Reply:
        """``POST /v1/batches/{batch_id}/cancel``."""
        try:
            self._access.check(request, "POST /v1/batches/{batch_id}/cancel")
            batch = self.batches.cancel(request.params["batch_id"])
        except ApiError as exc:
            return _error(exc)
        return Response.json(200, self.batches.to_json(batch))


def _error(exc: ApiError) -> Response:
    return Response.json(exc.status, exc.body(), exc.headers)
