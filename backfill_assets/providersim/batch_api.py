"""Routes of the Files and Batch APIs; retrieve and list share a status-poll rate limit."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from urllib.parse import parse_qs

from backfill_assets.providersim.batches import BatchStore
from backfill_assets.providersim.config import SimConfig
from backfill_assets.providersim.files import FileStore
from backfill_assets.providersim.http import Reply, Request, Response, Router
from backfill_assets.providersim.limits import TokenBucket, retry_after_headers
from backfill_assets.providersim.meter import Meter
from backfill_assets.providersim.wire import ApiError

Authorize = Callable[[Request], None]


class BatchApi:
    """Handlers for ``/v1/files`` and ``/v1/batches`` (state lives on the server's loop)."""

    def __init__(self, config: SimConfig, meter: Meter, authorize: Authorize) -> None:
        self._meter = meter
        self._authorize = authorize
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
                    headers=retry_after_headers(wait),
                )
            self._polls.take(1)
        self._meter.record_batch_poll(limited)

    async def upload_file(self, request: Request) -> Reply:
        """``POST /v1/files`` (multipart: ``purpose`` and ``file``)."""
        try:
            self._authorize(request)
            stored = self.files.upload(request.headers.get("content-type", ""), request.body)
        except ApiError as exc:
            return _error(exc)
        self._meter.record_upload()
        return Response.json(200, stored.to_json())

    async def retrieve_file(self, request: Request) -> Reply:
        """``GET /v1/files/{file_id}``."""
        try:
            self._authorize(request)
            return Response.json(200, self.files.get(request.params["file_id"]).to_json())
        except ApiError as exc:
            return _error(exc)

    async def file_content(self, request: Request) -> Reply:
        """``GET /v1/files/{file_id}/content``: the raw bytes."""
        try:
            self._authorize(request)
            self.batches.advance()
            stored = self.files.get(request.params["file_id"])
        except ApiError as exc:
            return _error(exc)
        return Response(200, stored.content, {"content-type": "application/octet-stream"})

    async def create_batch(self, request: Request) -> Reply:
        """``POST /v1/batches``."""
        try:
            self._authorize(request)
            try:
                body = json.loads(request.body)
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                raise ApiError(400, "We could not parse the JSON body of your request.") from None
            batch = self.batches.create(body)
        except ApiError as exc:
            return _error(exc)
        return Response.json(200, self.batches.to_json(batch))

    async def retrieve_batch(self, request: Request) -> Reply:
        """``GET /v1/batches/{batch_id}`` (rate-limited like a status endpoint)."""
        try:
            self._authorize(request)
            self._poll_admitted()
            batch = self.batches.get(request.params["batch_id"])
        except ApiError as exc:
            return _error(exc)
        return Response.json(200, self.batches.to_json(batch))

    async def list_batches(self, request: Request) -> Reply:
        """``GET /v1/batches?limit=&after=``, newest first, with each batch's metadata."""
        query = parse_qs(request.query)
        try:
            self._authorize(request)
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
            self._authorize(request)
            batch = self.batches.cancel(request.params["batch_id"])
        except ApiError as exc:
            return _error(exc)
        return Response.json(200, self.batches.to_json(batch))


def _error(exc: ApiError) -> Response:
    return Response.json(exc.status, exc.body(), exc.headers)
