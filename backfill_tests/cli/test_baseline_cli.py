"""``baseline import`` and ``evaluate --against-baseline``, on both stores: a previous
classifier's Perspective-shaped scores mapped onto the policy's labels by threshold, rows
rejected with their line and reason, a re-import that changes nothing, the transitions, the
agreement and Cohen's kappa per tenant against a hand-computed example, the posts whose action
changed written for review, and nothing of a baseline reaching ``applied_labels``, the posts'
label columns or the sink."""

from __future__ import annotations

import csv
import json
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.platform_db.sink import sink_table
from backfill_tests.conftest import import_records, write_jsonl

# Post -> text; the fake model labels by keyword: abuse, spam, needs_review, else ok.
ACME = {
    "p1": "you idiot",
    "p2": "you moron, shut up",
    "p3": "buy now, limited offer",
    "p4": "=SUM(1) nice weather",
    "p5": "lovely day",
    "p6": "great match yesterday",
    "p7": "thinking about self-harm",
    "p8": "see you at the meetup",
}
GLOBEX = {"g1": "click here for a casino", "g2": "hello there"}
MAPPING = (
    "attributes:\n"
    "  TOXICITY: {abuse: 0.8, needs_review: 0.5}\n"
    "  INSULT: {abuse: 0.7}\n"
    "  THREAT: {abuse: 0.6}\n"
)


def _perspective(**scores: float) -> dict[str, Any]:
    """Perspective API's response shape."""
    return {
        name: {"summaryScore": {"value": v, "type": "PROBABILITY"}, "spanScores": []}
        for name, v in scores.items()
    }


# Lines 1-8: one per post (p6 as a flat scores object); 9-12: rejected.
BASELINE = [
    {
        "tenant_id": "acme",
        "post_id": "p1",
        "attributeScores": _perspective(TOXICITY=0.95, INSULT=0.9),
    },
    {
        "tenant_id": "acme",
        "post_id": "p2",
        "attributeScores": _perspective(TOXICITY=0.6, INSULT=0.65),
    },
    {"tenant_id": "acme", "post_id": "p3", "attributeScores": _perspective(TOXICITY=0.1)},
    {"tenant_id": "acme", "post_id": "p4", "attributeScores": _perspective(TOXICITY=0.85)},
    {"tenant_id": "acme", "post_id": "p5", "attributeScores": _perspective(TOXICITY=0.2)},
    {"tenant_id": "acme", "post_id": "p6", "scores": {"TOXICITY": 0.3, "THREAT": 0.7}},
    {"tenant_id": "acme", "post_id": "p7", "attributeScores": _perspective(TOXICITY=0.55)},
    {"tenant_id": "acme", "post_id": "p8", "attributeScores": _perspective(TOXICITY=0.05)},
    {"tenant_id": "acme", "post_id": "p99", "attributeScores": _perspective(TOXICITY=0.5)},
    {"tenant_id": "acme", "post_id": "p5", "attributeScores": _perspective(TOXICITY=1.5)},
    {"tenant_id": "globex", "post_id": "g1", "label": "spam"},
    {"tenant_id": "acme", "post_id": "p5", "label": "bogus"},
]
# By hand, from the thresholds above (old label, the fake model's label).
EXPECTED_OLD = {
    "p1": "abuse",  # TOXICITY 0.95 in its abuse band, the highest score
    "p2": "needs_review",  # TOXICITY 0.6: its needs_review band; INSULT 0.65 under 0.7
    "p3": "ok",
    "p4": "abuse",
    "p5": "ok",
    "p6": "abuse",  # THREAT 0.7 over 0.6
    "p7": "needs_review",
    "p8": "ok",
}
TRANSITIONS = {
    "abuse": {"abuse": 1, "ok": 2},  # p1; p4, p6
    "needs_review": {"abuse": 1, "needs_review": 1},  # p2; p7
    "ok": {"ok": 2, "spam": 1},  # p5, p8; p3
}
# Agreement 4/8. Old marginals: abuse 3, needs_review 2, ok 3; new: abuse 2, needs_review 1,
# ok 4, spam 1. Chance: (3*2 + 2*1 + 3*4) / 64 = 20/64. Kappa: (1/2 - 5/16) / (11/16) = 3/11.
KAPPA = 3 / 11


def _state(engine: Engine, sink: str) -> tuple[Any, ...]:
    """Everything a label is applied to: applied_labels, the posts' label columns, the sink."""
    with engine.connect() as conn:
        applied = conn.execute(
            sa.text("SELECT * FROM applied_labels ORDER BY tenant_id, post_id, policy_id")
        ).all()
        posts = conn.execute(
            sa.text(
                "SELECT tenant_id, post_id, moderation_label, moderation_rubric_version,"
                " moderation_label_shadow, moderation_rubric_version_shadow FROM posts"
                " ORDER BY tenant_id, post_id"
            )
        ).all()
    with sqlite3.connect(sink.removeprefix("sqlite:///")) as db:
        written = db.execute("SELECT * FROM moderation_labels ORDER BY 1, 2, 3").fetchall()
    return [tuple(r) for r in applied], [tuple(r) for r in posts], written


@pytest.fixture
def labelled(
    engine: Engine, cli_store: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Engine, str]:
    """Both tenants' posts labelled by the fake model through `run`, written to the sink."""
    sink = f"sqlite:///{tmp_path / 'platform.db'}"
    platform = sa.create_engine(sink)
    with platform.begin() as conn:
        conn.exec_driver_sql(str(sa.schema.CreateTable(sink_table()).compile(platform)))
    platform.dispose()
    monkeypatch.setenv("BACKFILL_SINK_URL", sink)
    records = [
        {"tenant_id": t, "post_id": p, "text": text}
        for t, posts in (("acme", ACME), ("globex", GLOBEX))
        for p, text in posts.items()
    ]
    import_records(engine, tmp_path, records)
    assert main(["run"]) == 0
    return engine, sink


def _json(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 0) -> Any:
    capsys.readouterr()
    assert main([*argv, "--json"]) == code, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_perspective_scores_mapped_by_threshold_and_measured_against_the_labels(
    labelled: tuple[Engine, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine, sink = labelled
    before = _state(engine, sink)
    mapping = tmp_path / "perspective.yaml"
    mapping.write_text(MAPPING)
    path = write_jsonl(tmp_path / "perspective.jsonl", BASELINE)
    argv = ["baseline", "import", str(path), "--name", "perspective", "--tenant", "acme"]
    doc = _json([*argv, "--mapping", str(mapping)], capsys)
    assert {k: doc[k] for k in ("read", "imported", "updated", "unchanged", "rejected")} == {
        "read": 12,
        "imported": 8,
        "updated": 0,
        "unchanged": 0,
        "rejected": 4,
    }
    assert [(r["line"], r["reason"]) for r in doc["rejects"]] == [
        (9, "no such post in the store (import the posts first)"),
        (10, "score of 'TOXICITY' is not a number in [0, 1]"),
        (11, "tenant_id 'globex' is not acme, the tenant this import is bound to"),
        (12, "label 'bogus' is not a label of policy default@1 (spam, abuse, needs_review, ok)"),
    ]
    with engine.connect() as conn:
        stored = dict(
            (str(p), str(label))
            for p, label in conn.execute(
                sa.text("SELECT post_id, label FROM baselines WHERE name = 'perspective'")
            )
        )
        scores = conn.execute(
            sa.text("SELECT scores FROM baselines WHERE post_id = 'p6'")
        ).scalar_one()
    assert stored == EXPECTED_OLD
    assert json.loads(scores) == {"THREAT": 0.7, "TOXICITY": 0.3}
    # The same file again: every row unchanged, nothing written.
    again = _json([*argv, "--mapping", str(mapping)], capsys)
    assert (again["imported"], again["updated"], again["unchanged"]) == (0, 0, 8)
    # A baseline never outranks anything: the labels in force, the posts' label columns and
    # the sink are as they were, also after a run and the comparison.
    assert _state(engine, sink) == before
    assert main(["run"]) == 0
    report = _json(["evaluate", "--against-baseline", "perspective"], capsys)
    assert _state(engine, sink) == before
    (acme,) = report["tenants"]
    assert acme["tenant"] == "acme" and acme["posts"] == 8
    assert acme["transitions"] == TRANSITIONS
    assert acme["agreement"] == pytest.approx(0.5)
    assert acme["kappa"] == pytest.approx(KAPPA)
    # With their 95% intervals, as for moderators' decisions.
    low, high = acme["kappa_ci95"]
    assert -1.0 <= low < KAPPA < high <= 1.0
    low, high = acme["agreement_ci95"]
    assert low < 0.5 < high
    # The new policy acts on p3 (spam), which the old scorer passed; it passes p4 and p6.
    assert acme["now_flagged"]["posts"] == 1 and acme["now_flagged"]["post_ids"] == ["p3"]
    assert acme["now_passed"]["posts"] == 2 and acme["now_passed"]["post_ids"] == ["p4", "p6"]


def test_the_posts_whose_action_changed_are_written_for_review(
    labelled: tuple[Engine, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "perspective.jsonl", BASELINE[:8])
    thresholds = [
        "--threshold=TOXICITY=abuse:0.8",
        "--threshold=TOXICITY=needs_review:0.5",
        "--threshold=INSULT=abuse:0.7",
        "--threshold=THREAT=abuse:0.6",
    ]
    _json(["baseline", "import", str(path), "--name", "perspective", *thresholds], capsys)
    # globex's old classifier gave labels (CSV): g1 spam -> spam, g2 spam -> ok.
    labels = tmp_path / "globex.csv"
    labels.write_text("tenant_id,post_id,label\nglobex,g1,spam\nglobex,g2,spam\n")
    doc = _json(["baseline", "import", str(labels), "--name", "perspective"], capsys)
    assert (doc["imported"], doc["rejected"]) == (2, 0)
    out = tmp_path / "review"
    report = _json(["evaluate", "--against-baseline", "perspective", "--out", str(out)], capsys)
    by_tenant = {t["tenant"]: t for t in report["tenants"]}
    assert by_tenant["globex"]["transitions"] == {"spam": {"ok": 1, "spam": 1}}
    assert by_tenant["globex"]["agreement"] == pytest.approx(0.5)
    # Old: spam 2; new: spam 1, ok 1. Chance 2*1/4 = 1/2: kappa (1/2 - 1/2) / (1/2) = 0.
    assert by_tenant["globex"]["kappa"] == pytest.approx(0.0)
    assert sorted(p.name for p in out.iterdir()) == ["acme.csv", "globex.csv"]
    with (out / "acme.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["post_id"], r["old_label"], r["new_label"], r["change"]) for r in rows] == [
        ("p3", "ok", "spam", "now_flagged"),
        ("p4", "abuse", "ok", "now_passed"),
        ("p6", "abuse", "ok", "now_passed"),
    ]
    # A text a spreadsheet would run is neutralised, as `export` does.
    assert rows[1]["text"] == "'=SUM(1) nice weather"
    assert stat.S_IMODE((out / "acme.csv").stat().st_mode) & 0o077 == 0
    one = _json(["evaluate", "--against-baseline", "perspective", "--tenant", "globex"], capsys)
    assert [t["tenant"] for t in one["tenants"]] == ["globex"]
    assert one["tenants"][0]["now_passed"]["post_ids"] == ["g2"]
    capsys.readouterr()
    assert main(["evaluate", "--against-baseline", "nothing"]) == 2
    assert "unknown baseline 'nothing'" in capsys.readouterr().err


def test_a_query_of_attribute_columns_and_refused_flags(
    labelled: tuple[Engine, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "old.db"
    with sqlite3.connect(source) as db:
        db.execute("CREATE TABLE scored (workspace TEXT, id TEXT, TOXICITY REAL, THREAT REAL)")
        db.executemany(
            "INSERT INTO scored VALUES (?, ?, ?, ?)",
            [("acme", "p1", 0.9, 0.1), ("acme", "p5", 0.1, 0.65), ("acme", "p8", 0.2, None)],
        )
    argv = [
        "baseline",
        "import",
        "--sql",
        f"sqlite:///{source}",
        "--query",
        "SELECT * FROM scored",
        "--name",
        "old-scorer",
        "--map",
        "tenant_id=workspace,post_id=id",
        "--threshold",
        "TOXICITY=abuse:0.8",
        "--threshold",
        "THREAT=abuse:0.6",
    ]
    doc = _json(argv, capsys)
    assert (doc["imported"], doc["rejected"]) == (3, 0)
    with labelled[0].connect() as conn:
        got = dict(
            (str(p), str(label))
            for p, label in conn.execute(
                sa.text("SELECT post_id, label FROM baselines WHERE name = 'old-scorer'")
            )
        )
    assert got == {"p1": "abuse", "p5": "abuse", "p8": "ok"}
    # A stricter THREAT band: p5 (THREAT 0.65) is ok now, the others as they were.
    again = _json([*argv[:-1], "THREAT=abuse:0.7"], capsys)
    assert (again["imported"], again["updated"], again["unchanged"]) == (0, 1, 2)
    # The same scores as a Parquet file's number columns (a null: no score for it).
    table = pa.table(
        {
            "tenant_id": ["acme", "acme", "acme"],
            "post_id": ["p1", "p5", "p8"],
            "TOXICITY": [0.9, 0.1, 0.2],
            "THREAT": [0.1, 0.65, None],
        }
    )
    pq.write_table(table, tmp_path / "old.parquet")
    flags = argv[argv.index("--threshold") :]
    doc = _json(
        ["baseline", "import", str(tmp_path / "old.parquet"), "--name", "pq", *flags], capsys
    )
    assert (doc["imported"], doc["rejected"]) == (3, 0)
    with labelled[0].connect() as conn:
        same = conn.execute(
            sa.text(
                "SELECT count(*) FROM baselines a JOIN baselines b ON a.post_id = b.post_id"
                " AND a.label = b.label WHERE a.name = 'old-scorer' AND b.name = 'pq'"
            )
        ).scalar_one()
    assert same == 2  # p5 differs: the Parquet import read it with THREAT at 0.6
    for bad, says in (
        (["--threshold", "TOXICITY=nothing:0.8"], "label 'nothing' is not in policy"),
        (["--threshold", "TOXICITY=abuse:1.5"], "threshold must be a number in (0, 1]"),
        (["--threshold", "TOXICITY=ok:0.5"], "none label"),
    ):
        capsys.readouterr()
        assert main([*argv[:-4], *bad]) == 2
        assert says in capsys.readouterr().err
