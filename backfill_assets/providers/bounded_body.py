"""Reading a provider's answer without trusting its size.

A 50 MB answer, a small gzip body that inflates to gigabytes, or a body that never ends would
otherwise sit whole in memory. Bodies are read raw and decompressed here, at most ``_CHUNK``
bytes of output per step (httpx's own decoder inflates each network chunk whole, and a 64 KiB
chunk of a gzip bomb is 64 MB), and reading stops at a cap. Only ``gzip`` and ``deflate`` are
asked for and accepted.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from typing import BinaryIO

import httpx

# A chat completion under a strict schema is a few hundred bytes; an error body a few KiB.
CHAT_MAX_BYTES = 1024 * 1024
# What every client asks for: encodings this module can inflate step by step.
ACCEPT_ENCODING = "gzip, deflate"
_CHUNK = 64 * 1024


class BadBody(Exception):
    """A body that is not read: past its cap, or in an encoding not asked for."""


class BodyTooLarge(BadBody):
    """The body passed its cap; what was read is discarded."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"answer body over {cap:,} bytes (cut)")
        self.cap = cap


async def decoded(response: httpx.Response) -> AsyncIterator[bytes]:
    """The body, decompressed at most ``_CHUNK`` bytes at a time."""
    if response.is_stream_consumed:
        # An answer already in memory (a transport that is not a network): nothing to bound.
        yield response.content
        return
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        async for raw in response.aiter_raw():
            yield raw
        return
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise BadBody(f"content-encoding {encoding[:20]!r} not accepted")
    # wbits 47: a gzip or a zlib header, detected.
    inflate = zlib.decompressobj(wbits=47)
    try:
        async for raw in response.aiter_raw():
            data = raw
            while data:
                out = inflate.decompress(data, _CHUNK)
                if out:
                    yield out
                data = inflate.unconsumed_tail
    except zlib.error:
        raise BadBody(f"{encoding} body does not inflate") from None


async def read_capped(response: httpx.Response, cap: int) -> bytes:
    """The decoded body, or ``BodyTooLarge`` as soon as it passes ``cap`` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in decoded(response):
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge(cap)
        parts.append(chunk)
    return b"".join(parts)


async def read_head(response: httpx.Response, cap: int) -> bytes:
    """At most ``cap`` bytes of the decoded body (an error body: its start is enough)."""
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in decoded(response):
            parts.append(chunk[: cap - size])
            size += len(parts[-1])
            if size >= cap:
                break
    except BadBody:
        pass  # what was read is the head
    return b"".join(parts)


async def stream_to(response: httpx.Response, out: BinaryIO, cap: int) -> int:
    """Write the decoded body to ``out``; ``BodyTooLarge`` past ``cap`` bytes. Its size."""
    size = 0
    async for chunk in decoded(response):
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge(cap)
        out.write(chunk)
    return size
