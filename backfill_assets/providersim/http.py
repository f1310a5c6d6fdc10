"""A small HTTP/1.1 server on asyncio streams and h11, with a tiny router.

Why not an ASGI server: faults need to drop a connection with a TCP reset, or hold a request
without answering, and those are exactly what frameworks hide.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import h11

_log = logging.getLogger(__name__)
_READ_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class Request:
    """One received request; header names are lower-cased."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes
    params: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Response:
    """A complete response (bodies here are small, so no streaming)."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response:
        """A JSON response."""
        merged = {"content-type": "application/json", **(headers or {})}
        return cls(status, json.dumps(payload).encode("utf-8"), merged)

    def with_headers(self, headers: Mapping[str, str]) -> Response:
        """A copy with ``headers`` added (existing names win)."""
        return replace(self, headers={**headers, **self.headers})


@dataclass(frozen=True, slots=True)
class Drop:
    """Close the connection without answering; ``reset`` sends a TCP RST instead of a FIN."""

    reset: bool = True


Reply = Response | Drop
Handler = Callable[[Request], Awaitable[Reply]]


def openai_error(status: int, message: str, error_type: str = "invalid_request_error") -> Response:
    """An OpenAI-shaped error response for failures outside any route."""
    body = {"error": {"message": message, "type": error_type, "param": None, "code": None}}
    return Response.json(status, body)


class Router:
    """Maps method and path templates (``/v1/batches/{batch_id}``) to handlers."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, tuple[str, ...], Handler]] = []

    def add(self, method: str, template: str, handler: Handler) -> None:
        """Register ``handler`` for ``method`` on ``template``."""
        self._routes.append((method.upper(), tuple(template.strip("/").split("/")), handler))

    @staticmethod
    def _match(template: tuple[str, ...], parts: tuple[str, ...]) -> dict[str, str] | None:
        if len(template) != len(parts):
            return None
        params: dict[str, str] = {}
        for want, got in zip(template, parts, strict=True):
            if want.startswith("{") and want.endswith("}"):
                params[want[1:-1]] = got
            elif want != got:
                return None
        return params

    async def __call__(self, request: Request) -> Reply:
        """Dispatch to the matching handler; 404 or 405 as the API would answer."""
        parts = tuple(request.path.strip("/").split("/"))
        path_known = False
        for method, template, handler in self._routes:
            params = self._match(template, parts)
            if params is None:
                continue
            path_known = True
            if method == request.method:
                return await handler(replace(request, params=params))
        if path_known:
            return openai_error(405, f"Method not allowed ({request.method} {request.path})")
        return openai_error(404, f"Invalid URL ({request.method} {request.path})")


class _BodyTooLarge(Exception):
    pass


class HttpServer:
    """Serves ``handler`` with keep-alive; tracks connections so ``close`` ends them all."""

    def __init__(self, handler: Handler, *, max_body_bytes: int) -> None:
        self._handler = handler
        self._max_body = max_body_bytes
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        """Bind and listen; returns the bound port (useful with ``port=0``)."""
        self._server = await asyncio.start_server(self._on_connection, host, port, backlog=2048)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def close(self) -> None:
        """Stop listening and end open connections, hung requests included."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        drop_with_reset = False
        try:
            drop_with_reset = await self._serve(h11.Connection(h11.SERVER), reader, writer)
        except (ConnectionError, TimeoutError, OSError):
            pass  # The peer went away; nothing left to answer.
        except asyncio.CancelledError:
            # Server shutdown. Swallowed because Python 3.11's stream callback calls
            # task.exception() on this task, which raises (and logs) if it ends cancelled.
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)
            _close(writer, reset=drop_with_reset)

    async def _serve(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer requests until the connection ends; True if it must end with a reset."""
        while True:
            try:
                request = await _read_request(conn, reader, writer, self._max_body)
            except h11.RemoteProtocolError as exc:
                await _send_final(conn, writer, openai_error(exc.error_status_hint, "Bad request"))
                return False
            except _BodyTooLarge:
                await _send_final(conn, writer, openai_error(413, "Request body too large"))
                return False
            if request is None:
                return False
            reply = await self._dispatch(request)
            if isinstance(reply, Drop):
                return reply.reset
            await _send(conn, writer, reply)
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return False
            conn.start_next_cycle()

    async def _dispatch(self, request: Request) -> Reply:
        try:
            return await self._handler(request)
        except Exception:
            _log.exception("providersim handler failed for %s %s", request.method, request.path)
            return openai_error(500, "internal simulator error", "server_error")


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await reader.read(_READ_CHUNK))


async def _read_request(
    conn: h11.Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    max_body: int,
) -> Request | None:
    """The next complete request, or None when the peer closed the connection."""
    head = await _next_event(conn, reader)
    if not isinstance(head, h11.Request):
        return None
    if conn.they_are_waiting_for_100_continue:
        writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
    body = bytearray()
    while True:
        event = await _next_event(conn, reader)
        if isinstance(event, h11.Data):
            body += event.data
            if len(body) > max_body:
                raise _BodyTooLarge
        elif isinstance(event, h11.EndOfMessage):
            break
        else:
            return None
    target = head.target.decode("ascii", "replace")
    path, _, query = target.partition("?")
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in head.headers}
    return Request(head.method.decode("ascii"), path, query, headers, bytes(body))


async def _send(conn: h11.Connection, writer: asyncio.StreamWriter, response: Response) -> None:
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return  # h11 cannot answer in this state (e.g. after a protocol error mid-response).
    headers = [("server", "providersim"), *response.headers.items()]
    headers.append(("content-length", str(len(response.body))))
    writer.write(conn.send(h11.Response(status_code=response.status, headers=headers)))
    writer.write(conn.send(h11.Data(data=response.body)))
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()


async def _send_final(
    conn: h11.Connection, writer: asyncio.StreamWriter, response: Response
) -> None:
    """Best-effort error answer before closing; h11 refuses some states after a bad request."""
    with contextlib.suppress(h11.LocalProtocolError):
        await _send(conn, writer, response.with_headers({"connection": "close"}))


def _close(writer: asyncio.StreamWriter, *, reset: bool) -> None:
    if reset:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Linger 0 turns close() into an RST: the client sees "connection reset by peer".
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
    else:
        writer.close()
