"""``evaluate --from-decisions``, on both stores: moderators' decisions are the gold set (each
decided post's current text, its newest decision's label and first rule), evaluated through
the same keys and ledger as ``evaluate GOLD``: the same figures as the same rows given as a
file, and a rerun, or the file, pays nothing."""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.ingest.gold import read_gold
from backfill_tests.cli_runs import cli_main
from backfill_tests.conftest import import_records
from backfill_tests.decision_helpers import record_decision
from backfill_tests.policy_helpers import COURSE_V5, DOCS_POLICIES, course

GOLD = DOCS_POLICIES / "course-gold.csv"
T0 = dt.datetime(2026, 11, 2, 9, 30)
CALLS = "SELECT count(*) FROM ledger_events WHERE type = 'attempt'"


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    code, out, err = cli_main(argv, capsys)
    try:
        return code, json.loads(out), err
    except json.JSONDecodeError:
        return code, out, err


@pytest.fixture
def env(
    engine: Engine, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    values = {
        "BACKFILL_DATABASE_URL": store_url,
        "DAGSTER_HOME": str(tmp_path / "home"),
        "BACKFILL_POLICY_PATH": str(COURSE_V5),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def decide(
    engine: Engine,
    tenant: str,
    post_id: str,
    label: str,
    rules: str = "",
    at: dt.datetime = T0,
    reviewer: str = "mod-7",
) -> None:
    """A moderator's decision under course v5 about the post's current text, applied."""
    policy = course("5")
    record_decision(
        engine,
        tenant,
        post_id,
        label,
        policy=policy,
        rules=rules,
        at=at,
        reviewer=reviewer,
        key_version=Rubric(policy).key_version,
    )


@pytest.fixture
def decided(engine: Engine, env: dict[str, str], tmp_path: Path) -> list[dict[str, str]]:
    """The course gold set's texts as acme's posts (and ten as globex's), each decided with
    the gold label; returns the gold rows ``--from-decisions`` should build, in order."""
    rows = read_gold(GOLD, "eval").rows
    recs = [{"tenant_id": "acme", "post_id": r.post.post_id, "text": r.post.text} for r in rows]
    recs += [
        {"tenant_id": "globex", **{k: v for k, v in x.items() if k != "tenant_id"}}
        for x in recs[:10]
    ]
    import_records(engine, tmp_path, recs)
    expected: list[dict[str, str]] = []
    for tenant, subset in (("acme", rows), ("globex", rows[:10])):
        for r in subset:
            pid = r.post.post_id
            rule = r.rule or ""
            if pid == "g001":
                # An older decision, overturned on appeal: the newest one is the gold label,
                # its rules sorted, the first one the gold rule.
                decide(engine, tenant, pid, "ok", at=T0 - dt.timedelta(days=3))
                rule = "SOL-1,SOL-2"
            decide(engine, tenant, pid, r.label, rule)
            first = rule.split(",")[0]
            expected.append(
                {"id": f"{tenant}/{pid}", "text": r.post.text, "label": r.label, "rule": first}
            )
    return expected


def _write_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, ["id", "text", "label", "rule"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def _calls(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(CALLS)).scalar_one())


def test_decisions_are_the_gold_set_the_file_of_them_matches_and_reruns_pay_nothing(
    engine: Engine,
    decided: list[dict[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, doc, err = _cli(["evaluate", "--from-decisions", "--json"], capsys)
    assert code == 0, err
    [v5] = doc["policies"]
    assert doc["tenant"] == "eval" and doc["gold"]["file"] is None
    assert doc["gold"]["source"] == "decisions:policy=course-rubric;tenant=*"
    assert v5["rows"] == 72 == len(decided) and v5["calls_this_run"] == 72
    assert _calls(engine) == 72
    # SOL-1 rows: g001-g006 of each tenant (g001's newest decision names SOL-1 and SOL-2:
    # the first counts, as a file's rule would).
    assert v5["rules"]["SOL-1"]["support"] == 12 and v5["gold"]["sha256"]

    # The same rows as a file: the same keys, so the same figures and not one call more.
    path = _write_csv(tmp_path / "decided.csv", decided)
    code, from_file, err = _cli(["evaluate", str(path), "--json"], capsys)
    assert code == 0, err
    [f5] = from_file["policies"]
    assert f5["calls_this_run"] == 0 and _calls(engine) == 72
    same = ("rows", "confusion", "macro_f1", "accuracy", "labels", "rules")
    assert {k: f5[k] for k in same} == {k: v5[k] for k in same}
    assert 0.5 < v5["macro_f1"] < 1.0

    # A rerun pays nothing and says the same; its digest names the same decided posts.
    code, again, _ = _cli(["evaluate", "--from-decisions", "--json"], capsys)
    assert code == 0 and again["policies"][0]["calls_this_run"] == 0 and _calls(engine) == 72
    assert again["policies"][0]["confusion"] == v5["confusion"]
    assert again["policies"][0]["gold"]["sha256"] == v5["gold"]["sha256"]

    # --tenant: one tenant's decisions (still booked to eval); --since: the newer ones only.
    code, globex, _ = _cli(["evaluate", "--from-decisions", "--tenant", "globex", "--json"], capsys)
    assert code == 0 and globex["tenant"] == "eval"
    assert globex["policies"][0]["rows"] == 10 and globex["policies"][0]["calls_this_run"] == 0
    decide(engine, "acme", "g050", "spam", at=T0 + dt.timedelta(days=5))
    argv = ["evaluate", "--from-decisions", "--since", "2026-11-05", "--json"]
    code, recent, _ = _cli(argv, capsys)
    assert code == 0 and recent["policies"][0]["rows"] == 1
    assert recent["policies"][0]["confusion"]["spam"]["ok"] == 1  # the model says ok
    with engine.connect() as conn:
        tenants = conn.execute(sa.text("SELECT DISTINCT tenant_id FROM ledger_events")).all()
    assert tenants == [("eval",)]


# SQLite only: argument handling; the queries behind it run on both stores above.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_from_decisions_refuses_a_file_too_and_an_empty_set(
    engine: Engine, env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(["evaluate"], capsys)
    assert code == 2 and "GOLD" in err
    for argv in (
        ["evaluate", str(GOLD), "--from-decisions"],
        ["evaluate", str(GOLD), "--since", "2026-01-01"],
    ):
        code, _, err = _cli(argv, capsys)
        assert code == 2 and "GOLD or --from-decisions" in err
    code, _, err = _cli(["evaluate", "--from-decisions", "--since", "yesterday"], capsys)
    assert code == 2 and "not an ISO 8601 date or time" in err
    code, _, err = _cli(["evaluate", "--from-decisions"], capsys)
    assert code == 2 and "no decided posts of any tenant under policy course-rubric" in err
    # An edited post's decision is about its old text: not a gold row.
    import_records(engine, tmp_path, [{"tenant_id": "acme", "post_id": "p1", "text": "hi"}])
    decide(engine, "acme", "p1", "ok")
    import_records(
        engine, tmp_path, [{"tenant_id": "acme", "post_id": "p1", "text": "edited"}], "e2.jsonl"
    )
    code, _, err = _cli(["evaluate", "--from-decisions", "--tenant", "acme"], capsys)
    assert code == 2 and "no decided posts of tenant acme" in err
    assert _calls(engine) == 0
