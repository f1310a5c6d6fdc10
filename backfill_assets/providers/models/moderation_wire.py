"""OpenAI's moderation API wire format as the adapter and batch mode need it (pure): the
request body and the results of a response, one per input."""

from __future__ import annotations

from typing import Any

from backfill_assets.providers.models.base import ModelRequest
from backfill_assets.providers.models.openai_wire import loads_or_none

ENDPOINT = "/v1/moderations"

# What the ledger says of a call whose endpoint bills no tokens (never "missing": nothing
# was left unreported, and no bound is booked in its place).
NO_USAGE = "none"


def moderation_body(request: ModelRequest) -> dict[str, Any]:
    """The request's posts as the endpoint's ``input`` array: each user message the dialect
    built is one post's text, unframed."""
    return {"model": request.model, "input": [m["content"] for m in request.messages]}


def results_of(body: bytes, inputs: int) -> list[dict[str, Any]]:
    """The results of a moderation response, one per input; ``ValueError`` saying why not."""
    data = loads_or_none(body)
    if not isinstance(data, dict):
        raise ValueError("2xx body is not a JSON object")
    results = data.get("results")
    if not isinstance(results, list):
        raise ValueError("2xx body has no results array")
    if len(results) != inputs or not all(isinstance(r, dict) for r in results):
        raise ValueError(f"{len(results)} results for {inputs} input(s)")
    return results
