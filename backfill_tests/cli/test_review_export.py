"""``review export``: one file per tenant of the posts a person should look at, with why, in
the formats of ``export``; a moderator's decision takes a post out of the next export."""

from __future__ import annotations

import csv
import json
import stat
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.domain.policy.rubric import Rubric
from backfill_tests.policy_helpers import COURSE_V5
from backfill_tests.review_helpers import (
    FORMULA,
    PER_TENANT,
    TENANTS,
    course_v6,
    decide,
    label_and_apply,
    labelled_store,
)

FORMATS = ("csv", "jsonl", "parquet")


@pytest.fixture
def store(
    engine: Engine, cli_store: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Rubric:
    monkeypatch.setenv("BACKFILL_POLICY_PATH", str(COURSE_V5))
    return labelled_store(engine, tmp_path)


def _read(path: Path, fmt: str) -> list[dict[str, Any]]:
    if fmt == "parquet":
        return list(pq.read_table(path).to_pylist())
    if fmt == "csv":
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def _export(
    out: Path, capsys: pytest.CaptureFixture[str], *more: str, fmt: str = "jsonl"
) -> dict[str, Any]:
    assert main(["review", "export", "--out", str(out), "--format", fmt, "--json", *more]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _queued(out: Path, tenant: str, fmt: str = "jsonl") -> dict[str, str]:
    """post id -> reason of a tenant's file."""
    return {r["post_id"]: r["reason"] for r in _read(out / f"{tenant}.{fmt}", fmt)}


def test_the_queue_holds_the_labels_whose_action_is_review(
    store: Rubric, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "queue"
    doc = _export(out, capsys)
    # needs_review is the one label with the action review; solution_leak (hide) and ok
    # (none) are not queued.
    assert _queued(out, "learn") == {
        "formula": "action_review",
        **{f"rev-{n}": "action_review" for n in range(PER_TENANT["learn"])},
    }
    assert _queued(out, "code-club") == {f"rev-{n}": "action_review" for n in range(2)}
    assert doc["total"] == 6 and doc["policy_id"] == "course-rubric"
    assert doc["review_labels"] == ["needs_review"] and doc["below"] is None
    files = {f["tenant"]: f for f in doc["files"]}
    assert {t: f["rows"] for t, f in files.items()} == {"code-club": 2, "learn": 4}
    assert files["learn"]["action_review"] == 4 and files["learn"]["below_threshold"] == 0
    (row,) = [r for r in _read(out / "learn.jsonl", "jsonl") if r["post_id"] == "rev-0"]
    assert row["tenant_id"] == "learn" and row["text"].startswith("Half my code below")
    assert row["label"] == "needs_review" and row["rule_ids"] == []
    assert 0.5 < row["confidence"] < 1 and row["p_label"] is None
    assert row["policy_version"] == "5" and row["source"] == "model"
    assert row["labelled_at"].endswith("Z")
    # Written privately, and nothing but the files is left behind.
    assert sorted(p.name for p in out.iterdir()) == ["code-club.jsonl", "learn.jsonl"]
    assert stat.S_IMODE((out / "learn.jsonl").stat().st_mode) == 0o600


def test_below_queues_the_labels_under_the_probability_too(
    store: Rubric, engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The fake model gives no probability: give some labels one, as a wire would.
    with engine.begin() as conn:
        for post_id, p in (("leak-0", 0.31), ("ok-1", 0.6), ("rev-1", 0.2), ("ok-0", 0.49)):
            conn.execute(
                sa.text(
                    "UPDATE results SET p_label = :p WHERE tenant_id = 'learn' AND post_id = :i"
                ),
                {"p": p, "i": post_id},
            )
    out = tmp_path / "queue"
    doc = _export(out, capsys, "--below", "0.5", "--tenant", "learn")
    assert _queued(out, "learn") == {
        "formula": "action_review",
        "rev-0": "action_review",
        "rev-1": "action_review",  # under 0.5 too: the first reason that holds
        "rev-2": "action_review",
        "leak-0": "below_threshold",
        "ok-0": "below_threshold",
    }  # ok-1 (0.6) is not under; labels without a probability never are
    assert doc["below"] == 0.5 and doc["files"][0]["below_threshold"] == 2
    rows = {r["post_id"]: r for r in _read(out / "learn.jsonl", "jsonl")}
    assert rows["leak-0"]["p_label"] == 0.31 and rows["leak-0"]["rule_ids"] == ["SOL-1"]
    # Without --below, the same store queues the review labels only.
    assert _export(out, capsys, "--tenant", "learn")["total"] == 4
    # A threshold outside 0..1 is refused before anything is written.
    refused = tmp_path / "refused"
    assert main(["review", "export", "--out", str(refused), "--below", "1.5"]) == 2
    assert not refused.exists()


def test_tenant_chooses_the_files_and_an_unknown_one_writes_nothing(
    store: Rubric, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "one"
    doc = _export(out, capsys, "--tenant", "code-club")
    assert [f["tenant"] for f in doc["files"]] == ["code-club"] and doc["total"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["code-club.jsonl"]
    refused = tmp_path / "refused"
    code = main(["review", "export", "--out", str(refused), "--tenant", "nobody"])
    assert code == 2 and not refused.exists()
    assert "backfill-moderation review export: error: argument --tenant" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_holds_the_same_rows(
    store: Rubric, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    out = tmp_path / fmt
    doc = _export(out, capsys, fmt=fmt)
    assert sorted(p.name for p in out.iterdir()) == [f"{t}.{fmt}" for t in sorted(TENANTS)]
    rows = _read(out / f"learn.{fmt}", fmt)
    assert (
        list(rows[0])
        == [
            "tenant_id",
            "post_id",
            "text",
            "label",
            "rule_ids",
            "confidence",
            "p_label",
            "policy_version",
            "source",
            "reason",
            "labelled_at",
        ]
        or fmt == "jsonl"
    )  # JSONL's keys are sorted
    assert [r["post_id"] for r in rows] == ["formula", "rev-0", "rev-1", "rev-2"]
    assert {f["tenant"]: f["rows"] for f in doc["files"]} == {"code-club": 2, "learn": 4}
    # Byte-identical when the queue has not changed.
    first = {f["tenant"]: f["sha256"] for f in doc["files"]}
    assert {f["tenant"]: f["sha256"] for f in _export(out, capsys, fmt=fmt)["files"]} == first


def test_csv_cells_are_neutralised_and_the_other_formats_exact(
    store: Rubric, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _export(tmp_path / "csv", capsys, fmt="csv")
    (cell,) = [
        r["text"] for r in _read(tmp_path / "csv" / "learn.csv", "csv") if r["post_id"] == "formula"
    ]
    assert cell == "'" + FORMULA
    _export(tmp_path / "pq", capsys, fmt="parquet")
    rows = _read(tmp_path / "pq" / "learn.parquet", "parquet")
    assert [r["text"] for r in rows if r["post_id"] == "formula"] == [FORMULA]


def test_a_decision_takes_the_post_out_of_the_next_export(
    store: Rubric, engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "queue"
    _export(out, capsys)
    assert "rev-1" in _queued(out, "learn")
    done = decide(engine, store, "learn", "rev-1", "ok")
    assert done.applied == 1
    doc = _export(out, capsys)
    assert "rev-1" not in _queued(out, "learn") and doc["total"] == 5
    # The other tenant's post of the same id stays queued.
    assert "rev-1" in _queued(out, "code-club")
    # Every tenant's queue decided: the files are rewritten empty, not left as they were.
    for t in TENANTS:
        for post_id in list(_queued(out, t)):
            decide(engine, store, t, post_id, "needs_review", minutes=1)
    doc = _export(out, capsys)
    assert doc["total"] == 0 and all(_queued(out, t) == {} for t in TENANTS)


def test_a_post_whose_decision_the_new_version_lacks_goes_back_to_review(
    store: Rubric,
    engine: Engine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Moderators decide two posts the model found fine: one harassment under HAR-1, one spam.
    assert decide(engine, store, "learn", "ok-0", "harassment", "HAR-1").applied == 1
    assert decide(engine, store, "learn", "ok-1", "spam", "SPAM-1").applied == 1
    out = tmp_path / "queue"
    _export(out, capsys)
    assert set(_queued(out, "learn")) == {"formula", "rev-0", "rev-1", "rev-2"}
    # Version 6 renames HAR-1: the harassment decision no longer holds, the spam one does.
    v6_file = course_v6(tmp_path)
    label_and_apply(engine, v6_file)
    monkeypatch.setenv("BACKFILL_POLICY_PATH", str(v6_file))
    doc = _export(out, capsys)
    queued = _queued(out, "learn")
    assert queued == {
        "ok-0": "decision_outdated",
        **{p: "action_review" for p in ("formula", "rev-0", "rev-1", "rev-2")},
    }
    (row,) = [r for r in _read(out / "learn.jsonl", "jsonl") if r["post_id"] == "ok-0"]
    assert row["label"] == "ok" and row["source"] == "model" and row["policy_version"] == "6"
    files = {f["tenant"]: f for f in doc["files"]}
    assert files["learn"]["decision_outdated"] == 1 and files["code-club"]["decision_outdated"] == 0
    # A decision under version 6 settles it.
    v6 = label_and_apply(engine, v6_file)
    assert decide(engine, v6, "learn", "ok-0", "harassment", "HAR-2", minutes=5).applied == 1
    _export(out, capsys)
    assert "ok-0" not in _queued(out, "learn")
