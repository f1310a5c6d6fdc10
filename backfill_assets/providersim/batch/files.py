"""The Files API as the Batch API needs it: upload (multipart), metadata and content.

Files live in memory for the simulator's lifetime: a crashed client that re-attaches hours
later must still be able to download its batch's output, as with a real provider.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from backfill_assets.providersim.wire import ApiError

PURPOSES = frozenset({"batch", "batch_output", "fine-tune", "assistants", "user_data"})


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One uploaded or generated file."""

    id: str
    purpose: str
    filename: str
    content: bytes
    created_at: int

    def to_json(self) -> dict[str, Any]:
        """The API's file object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
        }


def _param(header: str, name: str) -> str | None:
    for part in header.split(";")[1:]:
        key, sep, value = part.strip().partition("=")
        if sep and key.strip().lower() == name:
            return value.strip().strip('"')
    return None


def parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """``multipart/form-data`` fields -> (filename, content); raises ``ApiError`` (400)."""
    if content_type.split(";")[0].strip().lower() != "multipart/form-data":
        raise ApiError(400, "Expected a multipart/form-data body.", code="invalid_request")
    boundary = _param(content_type, "boundary")
    if not boundary:
        raise ApiError(400, "Missing multipart boundary.", code="invalid_request")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in body.split(b"--" + boundary.encode("latin-1"))[1:]:
        if part.startswith(b"--"):
            break  # the closing delimiter
        head, sep, content = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not sep:
            raise ApiError(400, "Malformed multipart part.", code="invalid_request")
        headers = {}
        for line in head.decode("latin-1").split("\r\n"):
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        disposition = headers.get("content-disposition", "")
        name = _param(disposition, "name")
        if name:
            fields[name] = (_param(disposition, "filename"), content.removesuffix(b"\r\n"))
    return fields


class FileStore:
    """Files by id."""

    def __init__(self, max_file_bytes: int) -> None:
        self._max = max_file_bytes
        self._files: dict[str, StoredFile] = {}

    def upload(self, content_type: str, body: bytes) -> StoredFile:
        """Store the ``file`` field of an upload with its ``purpose``."""
        fields = parse_multipart(content_type, body)
        purpose = fields.get("purpose", (None, b""))[1].decode("utf-8", "replace")
        if purpose not in PURPOSES:
            raise ApiError(400, f"Invalid purpose {purpose!r}.", param="purpose")
        if "file" not in fields:
            raise ApiError(400, "Missing required parameter: 'file'.", param="file")
        filename, content = fields["file"]
        if len(content) > self._max:
            raise ApiError(400, f"File is larger than {self._max} bytes.", param="file")
        return self.add(purpose, filename or "upload.jsonl", content)

    def add(self, purpose: str, filename: str, content: bytes) -> StoredFile:
        """Store a file (uploads and the batch output the simulator writes)."""
        stored = StoredFile(
            f"file-{secrets.token_hex(12)}", purpose, filename, content, int(time.time())
        )
        self._files[stored.id] = stored
        return stored

    def get(self, file_id: str) -> StoredFile:
        """A file, or a 404 as the API answers."""
        found = self._files.get(file_id)
        if found is None:
            raise ApiError(404, f"No such File object: {file_id}", param="id")
        return found
