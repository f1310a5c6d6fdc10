"""A provider whose answers are too big: a loopback HTTP server for one hostile body shape.

Every request is answered 200 (``application/json``) with a body that is
- ``huge``: a valid-looking JSON prefix padded to ``size`` bytes (Content-Length given);
- ``gzip``: a small gzip body that inflates to ``size`` bytes of zeros (a "gzip bomb");
- ``endless``: chunked, chunks forever until the client goes away.

Raw sockets, not h11: the point is to send what a well-behaved server never would.
"""

from __future__ import annotations

import gzip
import socket
import threading
from typing import Literal

BodyShape = Literal["huge", "gzip", "endless"]
_CHUNK = 64 * 1024


class BodyServer:
    """``with BodyServer("gzip", size=200 << 20) as url: ...``; ``url`` ends in ``/v1``."""

    def __init__(self, shape: BodyShape, size: int = 50 << 20) -> None:
        self.shape = shape
        self.size = size
        self.requests = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._bomb = gzip.compress(b"0" * size, compresslevel=9) if shape == "gzip" else b""

    def __enter__(self) -> str:
        self._thread.start()
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                self._read_request(conn)
                self.requests += 1
                self._send(conn)
            except OSError:
                pass  # the client hung up: what it should do

    @staticmethod
    def _read_request(conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(_CHUNK)
            if not chunk:
                raise OSError("closed")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = conn.recv(_CHUNK)
            if not chunk:
                raise OSError("closed")
            body += chunk

    def _send(self, conn: socket.socket) -> None:
        base = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-request-id: req_1\r\n"
        if self.shape == "huge":
            prefix = b'{"id": "c1", "pad": "'
            conn.sendall(base + b"content-length: %d\r\n\r\n" % self.size + prefix)
            left = self.size - len(prefix)
            block = b"x" * _CHUNK
            while left > 0 and not self._stop.is_set():
                conn.sendall(block[: min(left, _CHUNK)])
                left -= _CHUNK
        elif self.shape == "gzip":
            conn.sendall(
                base
                + b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(self._bomb)
                + self._bomb
            )
        else:
            conn.sendall(base + b"transfer-encoding: chunked\r\n\r\n")
            block = b"%x\r\n" % _CHUNK + b"[" * _CHUNK + b"\r\n"
            while not self._stop.is_set():
                conn.sendall(block)
