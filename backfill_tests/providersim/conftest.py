"""Fixtures for the provider simulator tests: started simulators and request bodies."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from backfill_assets.domain.policy.rubric import Rubric
from backfill_tests.conftest import StartSim as StartSim  # re-exported for the tests


def _key_for(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _chat_body(key: str, text: str = "hello there", **extra: Any) -> dict[str, Any]:
    """A request body as the pipeline sends it (rubric messages, strict JSON schema)."""
    body: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "messages": Rubric().messages(key, text),
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "moderation", "strict": True, "schema": Rubric().schema},
        },
        "max_tokens": 64,
        "temperature": 0,
    }
    body.update(extra)
    return body


@pytest.fixture
def key_for() -> Callable[[str], str]:
    """A 64-hex correlation id derived from a readable name."""
    return _key_for


@pytest.fixture
def chat_body() -> Callable[..., dict[str, Any]]:
    """Build a request body as the pipeline sends it: ``chat_body(key, text, **overrides)``."""
    return _chat_body
