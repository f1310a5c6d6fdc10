"""Batch API calls the simulator tests share: upload, create, submit, wait, read a file."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

FAST = {"batch_validating_ms": 2, "batch_processing_ms": 20, "batch_finalizing_ms": 2}
TERMINAL = {"completed", "failed", "expired", "cancelled"}


def jsonl(items: list[dict[str, Any]]) -> bytes:
    """JSONL bytes of ``items``."""
    return b"".join(json.dumps(i).encode() + b"\n" for i in items)


def request_lines(
    chat_body: Callable[..., dict[str, Any]], keys: list[str]
) -> list[dict[str, Any]]:
    """One batch request line per key, bodies as the pipeline sends them."""
    return [
        {"custom_id": k, "method": "POST", "url": "/v1/chat/completions", "body": chat_body(k)}
        for k in keys
    ]


def upload(client: httpx.Client, content: bytes, purpose: str = "batch") -> httpx.Response:
    """``POST /files``."""
    return client.post(
        "/files", data={"purpose": purpose}, files={"file": ("in.jsonl", content, "text/plain")}
    )


def create(client: httpx.Client, file_id: str, **extra: Any) -> httpx.Response:
    """``POST /batches`` for an uploaded file (``extra`` overrides body fields)."""
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
    return client.post("/batches", json={"completion_window": "24h", **body, **extra})


def submit(client: httpx.Client, items: list[dict[str, Any]], chunk: str = "c") -> dict[str, Any]:
    """Upload ``items`` and create a batch with ``metadata.chunk_id``; the created batch."""
    file_id = upload(client, jsonl(items)).json()["id"]
    resp = create(client, file_id, metadata={"chunk_id": chunk})
    assert resp.status_code == 200, resp.text
    batch: dict[str, Any] = resp.json()
    return batch


def wait(client: httpx.Client, created: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Poll until terminal; the statuses seen, starting with the one ``create`` returned."""
    batch_id = created["id"]
    seen: list[str] = [created["status"]]
    for _ in range(500):
        batch: dict[str, Any] = client.get(f"/batches/{batch_id}").json()
        if seen[-1] != batch["status"]:
            seen.append(batch["status"])
        if batch["status"] in TERMINAL:
            return batch, seen
        time.sleep(0.002)
    raise AssertionError(f"batch {batch_id} did not finish: {seen}")


def file_lines(client: httpx.Client, file_id: str | None) -> dict[str, dict[str, Any]]:
    """A result file's lines by custom id ({} when there is no file)."""
    if file_id is None:
        return {}
    content = client.get(f"/files/{file_id}/content").content
    return {line["custom_id"]: line for line in map(json.loads, content.splitlines())}
