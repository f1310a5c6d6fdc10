"""The rows a run books are built in one place: each carries exactly its table's columns (and
the writer's routing fields), whichever path built it."""

from __future__ import annotations

from backfill_assets.domain.caps import REASON_CHARS
from backfill_assets.domain.policy.output_gate import ModerationOutput
from backfill_assets.domain.work.events import EventKind
from backfill_assets.domain.work.outcomes import Outcome
from backfill_assets.ledger.run.rows import dead_row, event_row, key_row, result_row
from backfill_assets.ledger.tables import dead_letters, ledger_events, results
from backfill_tests.pipeline_helpers import VERSIONS

KEY = key_row(
    VERSIONS, "run-1", key="k" * 64, tenant_id="t1", post_id="p1", slice_no=3, content_hash="h"
)
OUT = ModerationOutput(
    schema_version=1, correlation_id="k" * 64, label="ok", rule_ids=(), confidence=0.9
)


def _columns(table: object) -> set[str]:
    return {c.name for c in table.c} - {"id"}  # type: ignore[attr-defined]


def test_each_row_holds_its_tables_columns() -> None:
    result = result_row(KEY, OUT, "s03|t1", had_dead_letter=False)
    # Plus what the frame check reads (the echoed key, the contract version) and the writer's
    # routing: none of them is stored.
    checked = {"correlation_id", "schema_version", "partition", "had_dead_letter"}
    assert set(result) == _columns(results) | checked
    dead = dead_row(KEY, Outcome.RETRY_EXHAUSTED, "x", 5)
    assert set(dead) == _columns(dead_letters)
    event = event_row(
        VERSIONS,
        "run-1",
        EventKind.USAGE,
        key=KEY["key"],
        tenant_id="t1",
        slice_no=3,
        attempt_id="a",
        attempt_no=1,
        post_id="p1",
        content_hash="h",
    )
    assert set(event) == _columns(ledger_events)
    # Later events point at the attempt: only the attempt carries the key's derivation.
    assert event["post_id"] is None and event["key_version"] is None


def test_a_rejected_result_becomes_a_dead_letter_of_the_same_shape() -> None:
    # The writer turns a result the frame check rejects into a dead letter with dead_row too:
    # no result field leaks into it, and its reason is capped like any other.
    result = result_row(KEY, OUT, "s03|t1", had_dead_letter=True)
    dead = dead_row(result, Outcome.SCHEMA_REJECTED, "r" * 2000, 1)
    assert set(dead) == _columns(dead_letters)
    assert dead["outcome"] == "schema_rejected" and len(dead["reason"]) == REASON_CHARS
    assert {k: dead[k] for k in KEY} == KEY  # type: ignore[literal-required]
