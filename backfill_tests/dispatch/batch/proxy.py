"""A hostile provider in front of the simulator: an ``httpx.MockTransport`` that forwards each
Files/Batches call to the simulator and misbehaves on request, the way real providers and
gateways do (refusals, lost answers, a batch list that lags behind creates, error texts that
echo the request).

Until the simulator grows these modes itself, batch-mode tests put this in front of it through
``BatchOptions.transport`` (the httpx seam), so nothing is patched.
"""

from __future__ import annotations

import json
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from backfill_assets.providersim import Simulator

# Response headers that describe the encoding of the body we already decoded.
_HOP = {"content-encoding", "transfer-encoding", "content-length", "connection"}


def error_response(
    status: int, code: str, message: str = "refused", kind: str = ""
) -> httpx.Response:
    """An OpenAI-style error answer."""
    body = {"error": {"message": message, "type": kind or "invalid_request_error", "code": code}}
    return httpx.Response(status, json=body)


def route(request: httpx.Request) -> str:
    """upload, create, list, retrieve, cancel, content or file (by method and path)."""
    parts = request.url.path.rstrip("/").split("/")
    tail = parts[parts.index("v1") + 1 :] if "v1" in parts else parts
    if tail[:1] == ["files"]:
        if request.method == "POST":
            return "upload"
        return "content" if tail[-1] == "content" else "file"
    if tail[:1] == ["batches"]:
        if request.method == "POST":
            return "cancel" if tail[-1] == "cancel" else "create"
        return "list" if len(tail) == 1 else "retrieve"
    return "other"


class SimProxy:
    """Forwards to ``sim``; each hook is off until a test sets it."""

    def __init__(self, sim: Simulator, api_key: str) -> None:
        self.sim = sim
        self._auth = {"authorization": f"Bearer {api_key}"}
        self.calls: Counter[str] = Counter()
        self.times: dict[str, list[float]] = {}
        # Canned answers for the next calls of a route (nothing is forwarded for them).
        self.refuse: dict[str, deque[httpx.Response]] = {}
        # Refuse a route with this answer for so many seconds after its first call.
        self.refuse_for: dict[str, tuple[float, Callable[[], httpx.Response]]] = {}
        # Creates that reach the provider but whose answer is lost (a read timeout).
        self.lose_create_answers = 0
        # GET /batches hides a new batch from this many list answers (retrieve sees it): an
        # eventually consistent list, counted in answers so tests do not depend on timing.
        self.list_lag = 0
        self._unlisted: dict[str, int] = {}
        # Rewrites of what the provider says (error files, batch objects).
        self.rewrite_content: Callable[[bytes], bytes] | None = None
        self.rewrite_batch: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None
        # The next creates are refused with a 400 quoting the file's first request verbatim.
        self.echo_create_refusals = 0

    def transport(self) -> httpx.MockTransport:
        """The transport to put into ``BatchOptions``."""
        return httpx.MockTransport(self.handle)

    async def _forward(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        async with httpx.AsyncClient(timeout=30.0) as client:
            answer = await client.send(request)
            await answer.aread()
        headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
        return httpx.Response(answer.status_code, headers=headers, content=answer.content)

    async def input_texts(self, file_id: str) -> list[str]:
        """The user messages of an uploaded batch file (what a provider could echo)."""
        url = f"{self.sim.base_url.rstrip('/')}/files/{file_id}/content"
        answer = await self._forward(httpx.Request("GET", url, headers=self._auth))
        out: list[str] = []
        for raw in answer.content.splitlines():
            if raw.strip():
                messages = json.loads(raw)["body"]["messages"]
                out.append(next(m["content"] for m in messages if m["role"] == "user"))
        return out

    async def handle(self, request: httpx.Request) -> httpx.Response:
        """The MockTransport handler."""
        name = route(request)
        self.calls[name] += 1
        self.times.setdefault(name, []).append(time.monotonic())
        canned = self.refuse.get(name)
        if canned:
            return canned.popleft()
        window = self.refuse_for.get(name)
        if window is not None and time.monotonic() - self.times[name][0] < window[0]:
            return window[1]()
        if name == "create" and self.echo_create_refusals > 0:
            self.echo_create_refusals -= 1
            await request.aread()
            [first, *_] = await self.input_texts(json.loads(request.content)["input_file_id"])
            return error_response(400, "invalid_request", f"Invalid message {first} in line 1")
        answer = await self._forward(request)
        if name == "create" and answer.status_code == 200:
            self._unlisted[answer.json()["id"]] = self.list_lag
            if self.lose_create_answers > 0:
                self.lose_create_answers -= 1
                raise httpx.ReadTimeout("answer lost", request=request)
        if name == "list" and answer.status_code == 200:
            page = answer.json()
            page["data"] = [b for b in page["data"] if self._unlisted.get(b["id"], 0) <= 0]
            for batch_id in self._unlisted:
                self._unlisted[batch_id] -= 1
            answer = httpx.Response(200, json=page)
        if name == "retrieve" and answer.status_code == 200 and self.rewrite_batch:
            answer = httpx.Response(200, json=await self.rewrite_batch(answer.json()))
        if name == "content" and answer.status_code == 200 and self.rewrite_content:
            answer = httpx.Response(200, content=self.rewrite_content(answer.content))
        return answer
