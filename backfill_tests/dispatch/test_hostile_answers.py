"""A model whose answers break the contract in every way ends each key schema_rejected.

Before the gate was hardened, one answer with a 400-digit confidence raised OverflowError in a
dispatcher worker and the whole run died; ``true`` where a number belongs was accepted.
"""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy.engine import Engine

from backfill_assets.providers.models.base import ModelAdapter, ModelRequest, ModelResponse
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import count, run, total, verify

VALID = {"schema_version": 1, "label": "ok", "rule_ids": [], "confidence": 0.5}
# Raw fragments spliced into an otherwise valid answer: (field, JSON literal).
HOSTILE: list[tuple[str, str]] = [
    ("confidence", "1" + "0" * 400),  # OverflowError in float()
    ("confidence", "1" + "0" * 5000),  # ValueError in int(): over 4,300 digits
    ("confidence", "true"),
    ("schema_version", "true"),
    ("confidence", "NaN"),
    ("confidence", "-Infinity"),
    ("confidence", "1e999"),
    ("label", '"ok", "label": "abuse"'),  # duplicate key
    ("label", '"nsfw"'),  # not a label of the policy
    ("rule_ids", '["SPAM-1"]'),  # not a rule of the policy
    ("rule_ids", "null"),
]


def _answer(key: str, field: str | None, literal: str | None) -> str:
    parts = {**{k: json.dumps(v) for k, v in VALID.items()}, "correlation_id": json.dumps(key)}
    if field is not None and literal is not None:
        parts[field] = literal
    return "{" + ", ".join(f'"{k}": {v}' for k, v in parts.items()) + "}"


class HostileModel(ModelAdapter):
    """Answers post ``h<i>`` with hostile answer ``i``; any other post validly."""

    name = "hostile"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.stats.calls += 1
        idx = int(request.post_id[1:]) if request.post_id.startswith("h") else -1
        field, literal = HOSTILE[idx] if idx >= 0 else (None, None)
        raw = _answer(request.key, field, literal)
        return ModelResponse(raw_text=raw, tokens_in=40, tokens_out=12, request_id="r")


def test_hostile_answers_are_schema_rejected_and_the_run_finishes(
    engine: Engine, tmp_path: Path
) -> None:
    records = [
        {"tenant_id": "acme", "post_id": f"h{i}", "text": f"post {i}"} for i in range(len(HOSTILE))
    ]
    records += [{"tenant_id": "acme", "post_id": f"v{i}", "text": f"fine {i}"} for i in range(4)]
    import_records(engine, tmp_path, records)
    reports, _ = run(engine, ["acme"], adapter=HostileModel())
    assert total(reports, "schema_rejected") == len(HOSTILE)
    assert total(reports, "accepted") == 4
    assert count(engine, "SELECT count(*) FROM dead_letters WHERE outcome = 'schema_rejected'") == (
        len(HOSTILE)
    )
    assert count(engine, "SELECT count(*) FROM results WHERE post_id LIKE 'h%'") == 0
    # Every answer was paid for and booked, hostile or not.
    assert count(engine, "SELECT count(*) FROM ledger_events WHERE type = 'usage'") == (
        len(HOSTILE) + 4
    )
    assert verify(engine).as_dict(require_complete=True)["ok"]
