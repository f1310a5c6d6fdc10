"""``decisions import`` on both stores: JSONL, CSV and Parquet give the same decisions; each
refusal is recorded with its line and reason (never the reviewer's address); a re-import is
unchanged and a changed row an update; a decision outranks the model's label after a run."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.ledger.policies import register_policy
from backfill_tests.cli_runs import cli_main, last_json
from backfill_tests.conftest import import_records, write_jsonl
from backfill_tests.policy_helpers import COURSE_TEXTS, COURSE_V5, course
from bench.decisions_bench import decisions_bench

POSTS = [
    {"tenant_id": "acme", "post_id": f"p{i}", "text": text}
    for i, text in enumerate(COURSE_TEXTS.values(), 1)
] + [{"tenant_id": "globex", "post_id": "g1", "text": COURSE_TEXTS["ok"]}]


@pytest.fixture
def store(
    engine: Engine, cli_store: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Engine:
    monkeypatch.setenv("BACKFILL_POLICY_PATH", str(COURSE_V5))
    import_records(engine, tmp_path, POSTS)
    return engine


def decision(**over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "tenant_id": "acme",
        "post_id": "p1",
        "policy_id": "course-rubric",
        "policy_version": "5",
        "label": "solution_leak",
        "rule_ids": ["SOL-2", "SOL-1"],
        "reviewer_id": "mod-17",
        "decided_at": "2026-11-30T11:00:00+01:00",
        "reason_code": "R-3",
    }
    row.update(over)
    return row


THREE = [
    decision(),
    decision(post_id="p3", label="contract_cheating", rule_ids=["PAY-1"], reason_code=None),
    decision(
        post_id="p7", label="ok", rule_ids=[], decided_at="2026-11-29T08:15:00", reason_code=None
    ),
]


def write(path: Path, rows: list[dict[str, Any]], fmt: str) -> Path:
    if fmt == "jsonl":
        return write_jsonl(path, rows)
    if fmt == "csv":
        with path.open("w", newline="", encoding="utf-8") as fh:
            out = csv.DictWriter(fh, fieldnames=list(rows[0]))
            out.writeheader()
            for r in rows:
                out.writerow(
                    {
                        **r,
                        "rule_ids": ";".join(r["rule_ids"]),
                        "reason_code": r["reason_code"] or "",
                    }
                )
        return path
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def imported(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = cli_main(["decisions", "import", *argv, "--json"], capsys)
    assert code == 0, err
    doc: dict[str, Any] = last_json(out)
    return doc


def stored(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT post_id, label, rule_ids, reviewer_id, decided_at, reason_code,"
                    " policy_version FROM decisions ORDER BY post_id"
                )
            )
        ]


def in_force(engine: Engine) -> dict[str, tuple[str, str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT post_id, label, rule_ids, source FROM applied_labels"
                " WHERE tenant_id = 'acme' ORDER BY post_id"
            )
        )
        return {str(p): (str(lab), str(r), str(s)) for p, lab, r, s in rows}


def _time(value: Any) -> str:
    return str(value)[:19].replace("T", " ")


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_every_format_gives_the_same_decisions_applied_over_the_posts(
    store: Engine, tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / f"decisions.{fmt}", THREE, fmt)
    doc = imported([str(path)], capsys)
    assert {k: doc[k] for k in ("read", "imported", "updated", "unchanged", "rejected")} == {
        "read": 3,
        "imported": 3,
        "updated": 0,
        "unchanged": 0,
        "rejected": 0,
    }
    assert doc["applied"] == 3
    rows = [
        (p, lab, rules, rev, _time(at), reason, v)
        for p, lab, rules, rev, at, reason, v in stored(store)
    ]
    assert rows == [
        # Rules sorted and comma-joined; a time with a zone in UTC, one without read as UTC.
        ("p1", "solution_leak", "SOL-1,SOL-2", "mod-17", "2026-11-30 10:00:00", "R-3", "5"),
        ("p3", "contract_cheating", "PAY-1", "mod-17", "2026-11-30 10:00:00", None, "5"),
        ("p7", "ok", "", "mod-17", "2026-11-29 08:15:00", None, "5"),
    ]
    assert in_force(store) == {
        "p1": ("solution_leak", "SOL-1,SOL-2", "human"),
        "p3": ("contract_cheating", "PAY-1", "human"),
        "p7": ("ok", "", "human"),
    }


def test_parquet_may_give_decided_at_as_a_timestamp(
    store: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{**d, "decided_at": None} for d in THREE[:2]]
    table = pa.Table.from_pylist(rows).set_column(
        list(rows[0]).index("decided_at"),
        "decided_at",
        # 10:00 UTC held as Arrow does (microseconds since the epoch, UTC), shown at +01:00.
        # Built from the instant, not from a Python datetime: once pandera is imported,
        # pyarrow reads an aware datetime's wall time as UTC.
        pa.array([1796032800000000] * 2, type=pa.int64()).cast(pa.timestamp("us", tz="+01:00")),
    )
    pq.write_table(table, tmp_path / "times.parquet")
    doc = imported([str(tmp_path / "times.parquet")], capsys)
    assert (doc["imported"], doc["rejected"]) == (2, 0)
    assert {_time(r[4]) for r in stored(store)} == {"2026-11-30 10:00:00"}


def test_each_refused_row_is_recorded_with_its_line_and_reason(
    store: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register_policy(store, course("4"))  # an older version the store has worked under
    rows = [
        decision(),  # 1: accepted
        decision(post_id="p2", label="nonsense"),  # 2
        decision(post_id="p2", label="spam", rule_ids=["XYZ-9"]),  # 3
        decision(post_id="p2", policy_version="9"),  # 4: never registered
        decision(post_id="p2", reviewer_id="jane.doe@example.com"),  # 5
        decision(post_id="p404"),  # 6: no such post
        decision(post_id="p2", decided_at="yesterday"),  # 7
        decision(tenant_id="globex", post_id="g1"),  # 8: another tenant than --tenant
        decision(post_id="g1"),  # 9: globex's post id, but acme's decision
        decision(post_id="p5", policy_version="4", label="spam", rule_ids=["SPAM-1"]),  # 10
        decision(post_id="p2", policy_version="4", rule_ids=["SOL-1"]),  # 11: not in v4
    ]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    doc = imported([str(path), "--tenant", "acme"], capsys)
    assert (doc["read"], doc["imported"], doc["rejected"]) == (11, 2, 9)
    code, out, _err = cli_main(["rejects", "--file", str(path), "--json"], capsys)
    assert code == 0
    reasons = {r["line"]: r["reason"] for r in last_json(out)["rejects"]}
    assert sorted(reasons) == [2, 3, 4, 5, 6, 7, 8, 9, 11]
    assert "label 'nonsense' is not a label of policy course-rubric version 5" in reasons[2]
    assert "rule 'XYZ-9' is not a rule of policy course-rubric version 5" in reasons[3]
    assert "version 9 is neither registered" in reasons[4]
    assert "looks like an email address" in reasons[5]
    assert "no such post of tenant acme" in reasons[6]
    assert "ISO 8601" in reasons[7]
    assert "is not acme, the tenant this import is bound to" in reasons[8]
    assert "no such post of tenant acme" in reasons[9]
    assert "rule 'SOL-1' is not a rule of policy course-rubric version 4" in reasons[11]
    assert "jane.doe" not in out  # a person's address is never echoed
    assert [r[0] for r in stored(store)] == ["p1", "p5"]
    with store.connect() as conn:
        globex = conn.execute(
            sa.text("SELECT count(*) FROM applied_labels WHERE tenant_id = 'globex'")
        ).scalar_one()
    assert globex == 0  # no decision reached another tenant's post


def test_a_reimport_is_unchanged_and_a_changed_row_an_update(
    store: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", THREE)
    assert imported([str(path)], capsys)["imported"] == 3
    again = imported([str(path)], capsys)
    assert (again["imported"], again["updated"], again["unchanged"]) == (0, 0, 3)
    assert (again["applied"], again["already_applied"]) == (0, 3)
    changed = [THREE[0], {**THREE[1], "label": "spam", "rule_ids": ["SPAM-1"]}, THREE[2]]
    write_jsonl(path, changed)
    doc = imported([str(path)], capsys)
    assert (doc["imported"], doc["updated"], doc["unchanged"], doc["applied"]) == (0, 1, 2, 1)
    assert in_force(store)["p3"] == ("spam", "SPAM-1", "human")
    assert len(stored(store)) == 3


def test_a_decision_outranks_the_models_label_after_a_run(
    store: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run"]) == 0
    model = in_force(store)
    assert model["p1"] == ("solution_leak", "SOL-1", "model")  # what the fake model answers
    path = write_jsonl(tmp_path / "d.jsonl", [decision(label="ok", rule_ids=[])])
    doc = imported([str(path)], capsys)
    assert (doc["imported"], doc["applied"]) == (1, 1)
    after = in_force(store)
    assert after["p1"] == ("ok", "", "human")
    assert {p: v for p, v in after.items() if p != "p1"} == {
        p: v for p, v in model.items() if p != "p1"
    }
    with store.connect() as conn:
        key = conn.execute(sa.text("SELECT decision_key FROM decisions")).scalar_one()
        held = conn.execute(
            sa.text("SELECT result_key FROM applied_labels WHERE post_id = 'p1'")
        ).scalar_one()
    assert held == key
    assert main(["run", "--force"]) == 0
    assert in_force(store)["p1"] == ("ok", "", "human")


def test_a_database_query_imports_decisions(
    store: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    platform = tmp_path / "platform.db"
    with sqlite3.connect(platform) as db:
        db.execute(
            "CREATE TABLE reviews (tenant_id, post_id, policy_id, policy_version, label, rules,"
            " moderator, decided_at, reason_code)"
        )
        db.executemany(
            "INSERT INTO reviews VALUES (?, ?, 'course-rubric', '5', ?, ?, 'mod-2', ?, NULL)",
            [
                ("acme", "p1", "solution_leak", "SOL-1;SOL-2", "2026-11-30T10:00:00Z"),
                ("acme", "p404", "ok", "", "2026-11-30T10:00:00Z"),
            ],
        )
    query = "SELECT * FROM reviews"
    argv = ["--sql", f"sqlite:///{platform}", "--query", query]
    doc = imported([*argv, "--map", "rule_ids=rules,reviewer_id=moderator"], capsys)
    assert (doc["read"], doc["imported"], doc["rejected"]) == (2, 1, 1)
    assert in_force(store)["p1"] == ("solution_leak", "SOL-1,SOL-2", "human")
    again = imported([*argv, "--map", "rule_ids=rules,reviewer_id=moderator"], capsys)
    assert (again["imported"], again["unchanged"]) == (0, 1)


def test_a_query_with_a_cursor_reads_on_from_its_mark(
    store: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    platform = tmp_path / "platform.db"
    insert = "INSERT INTO reviews VALUES ('acme', ?, 'course-rubric', '5', ?, '', 'mod-2', ?, NULL)"
    with sqlite3.connect(platform) as db:
        db.execute(
            "CREATE TABLE reviews (tenant_id, post_id, policy_id, policy_version, label,"
            " rule_ids, reviewer_id, decided_at, reason_code)"
        )
        db.executemany(
            insert,
            [("p1", "ok", "2026-11-30T10:00:00"), ("p2", "spam", "2026-11-30T10:05:00")],
        )
    argv = ["--sql", f"sqlite:///{platform}", "--query", "SELECT * FROM reviews"]
    argv += ["--source", "reviews", "--cursor", "decided_at"]
    first = imported(argv, capsys)
    assert (first["read"], first["imported"]) == (2, 2)
    assert first["high_water"] == {
        "decided_at": "2026-11-30T10:05:00",
        "tenant_id": "acme",
        "post_id": "p2",
    }
    with sqlite3.connect(platform) as db:
        db.execute(insert, ("p3", "ok", "2026-11-30T11:00:00"))
    # From the mark's value on, that value again: the mark's row unchanged, the new one new.
    again = imported(argv, capsys)
    assert (again["read"], again["imported"], again["unchanged"]) == (2, 1, 1)
    assert again["high_water"]["post_id"] == "p3"
    assert in_force(store)["p3"] == ("ok", "", "human")
    code, _out, err = cli_main(["decisions", "import", *argv[:4], "--source", "reviews"], capsys)
    assert code == 2 and "a source keeps its cursor" in err


def test_unusable_input_exits_2_with_the_reason(
    store: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = cli_main(["decisions", "import", str(tmp_path / "nope.jsonl")], capsys)
    assert code == 2
    assert "decisions import: error:" in err and "no such file" in err
    bad = tmp_path / "bad.csv"
    rows = [{**decision(), "rule_ids": "SOL-1"}]
    with bad.open("w", newline="") as fh:
        header = [c if c != "reviewer_id" else "moderator" for c in rows[0]]
        out = csv.writer(fh)
        out.writerow(header)
        out.writerow(list(rows[0].values()))
    code, _out, err = cli_main(["decisions", "import", str(bad)], capsys)
    assert code == 2
    assert "no column for reviewer_id" in err
    assert imported([str(bad), "--map", "reviewer_id=moderator"], capsys)["imported"] == 1
    code, _out, err = cli_main(["decisions", "import", str(bad), "--map", "who=moderator"], capsys)
    assert code == 2 and "unknown field 'who'" in err
    assert json.loads(json.dumps(stored(store)[0][1])) == "solution_leak"


@pytest.mark.pg
def test_the_decisions_bench_runs_small(pg_available: bool) -> None:
    if not pg_available:
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    # The bench checks its own counts: every decision new and applied, then all unchanged.
    doc = decisions_bench(2_000, 5)
    assert doc["posts"] == 2_000
    assert doc["import_s"] > 0 and doc["reimport_rss_mb"] > 0
