"""``evaluate`` on the course gold set (62 rows), on both stores: figures equal a confusion
matrix worked out by hand, a rerun sends 0 requests, ``--against`` transitions add up, the
gate refuses ``run`` and ``launch`` and fails its asset check, and ``run --sample`` is a canary
the full run does not pay for again (docs/policies.md, "Evaluation")."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.definitions import build_definitions
from backfill_assets.defs.asset_keys import POLICY_EVALUATION
from backfill_assets.defs.reporting.evaluation import GATE_CHECK
from backfill_assets.domain.money.nanos import usd_text, whole_nanos
from backfill_assets.ingest.gold import read_gold
from backfill_tests.cli_runs import cli_main
from backfill_tests.conftest import import_records
from backfill_tests.moderation_helpers import load
from backfill_tests.policy_helpers import COURSE_V4, COURSE_V5, DOCS_POLICIES

GOLD = DOCS_POLICIES / "course-gold.csv"
LABELS = ["solution_leak", "contract_cheating", "harassment", "spam", "needs_review", "ok"]
# Worked out from the gold set and the fake model's rule (a rule id in the text decides, then
# the keyword rules for labels the policy shares with the built-in one, then a label id, else
# ok), row by row of course-gold.csv:
# - solution_leak: g001-g010 name SOL-1/SOL-2 (hit); g011, g012 name none (-> ok).
# - contract_cheating: g013-g020 name PAY-1 (hit); g021, g022 do not (-> ok).
# - harassment: g023-g028 name HAR-1; g029, g030 only insult (abuse is not a label: -> ok).
# - spam: g031-g036 "BUY NOW ..." and g037, g038 (keywords: spam) all hit.
# - needs_review: g039-g042 say needs_review; g043, g044 do not (-> ok).
# - ok: 16 plain; g061 "free money ... click here" (-> spam), g062 names SOL-1 (-> solution_leak).
V5_CONFUSION = {
    "solution_leak": {"solution_leak": 10, "ok": 2},
    "contract_cheating": {"contract_cheating": 8, "ok": 2},
    "harassment": {"harassment": 6, "ok": 2},
    "spam": {"spam": 8},
    "needs_review": {"needs_review": 4, "ok": 2},
    "ok": {"ok": 16, "spam": 1, "solution_leak": 1},
}
# v4 has no SOL-1 or PAY-1: those rows fall through to ok (SOL-2 rows still hit).
V4_CONFUSION = {
    **V5_CONFUSION,
    "solution_leak": {"solution_leak": 4, "ok": 8},
    "contract_cheating": {"ok": 10},
    "ok": {"ok": 17, "spam": 1},
}


def _full(matrix: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    cols = [*LABELS, "(no label)"]
    return {e: {c: row.get(c, 0) for c in cols} for e, row in matrix.items()}


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    """``cli_main``, with standard output parsed when it is a JSON document."""
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


def _by_label(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["label"]: f for f in report["labels"]}


def test_evaluate_reports_figures_reruns_free_and_compares(
    engine: Engine, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc, _ = _cli(["evaluate", str(GOLD), "--json"], capsys)
    assert code == 0, doc
    [v5] = doc["policies"]
    assert doc["tenant"] == "eval" and v5["rows"] == 62 and doc["rejected"] == []
    assert v5["confusion"] == _full(V5_CONFUSION)
    # Every figure follows from the hand-made matrix.
    for label in LABELS:
        tp = V5_CONFUSION[label].get(label, 0)
        support = sum(V5_CONFUSION[label].values())
        said = sum(row.get(label, 0) for row in V5_CONFUSION.values())
        got = _by_label(v5)[label]
        assert (got["support"], got["predicted"], got["true_positives"]) == (support, said, tp)
        assert got["precision"] == pytest.approx(tp / said) and got["recall"] == (tp / support)
    f1s = [_by_label(v5)[lb]["f1"] for lb in LABELS]
    assert v5["macro_f1"] == pytest.approx(sum(f1s) / 6)
    assert v5["accuracy"] == pytest.approx(52 / 62)
    assert v5["schema_rejected_share"] == 0.0 and v5["calls_this_run"] == 62
    assert v5["rules"]["SOL-1"] == {"support": 6, "found": 6}
    calls = "SELECT count(*) FROM ledger_events WHERE type = 'attempt'"
    with engine.connect() as conn:
        assert conn.execute(sa.text(calls)).scalar_one() == 62
        # Booked to the evaluation tenant, never a customer's.
        tenants = conn.execute(sa.text("SELECT DISTINCT tenant_id FROM ledger_events")).all()
        assert tenants == [("eval",)]
        # Tokens and cost are what the ledger booked for the evaluation's usage events.
        booked = conn.execute(
            sa.text(
                "SELECT sum(tokens_in), sum(tokens_out), sum(cost_nanos) FROM ledger_events"
                " WHERE type = 'usage'"
            )
        ).one()
    assert (v5["tokens_in"], v5["tokens_out"]) == (booked[0], booked[1]) and booked[0] > 0
    # Exact: the nano-dollars the ledger booked, shown as dollars.
    assert v5["cost_usd"] == usd_text(int(booked[2]))
    per_1000 = whole_nanos(Decimal(int(booked[2])) * 1000 / 62)
    assert v5["cost_per_1000_posts_usd"] == usd_text(per_1000)

    # A rerun pays nothing; --against adds v4, and the transitions account for every row.
    code, doc, _ = _cli(["evaluate", str(GOLD), "--against", str(COURSE_V4), "--json"], capsys)
    assert code == 0
    v4, again = doc["policies"]
    assert again["calls_this_run"] == 0 and again["confusion"] == v5["confusion"]
    assert v4["calls_this_run"] == 62 and v4["confusion"] == _full(V4_CONFUSION)
    cmp = doc["comparison"]
    moves = cmp["transitions"]
    assert sum(n for row in moves.values() for n in row.values()) == 62
    assert moves["ok"]["solution_leak"] == 7 and moves["ok"]["contract_cheating"] == 8
    assert cmp["agreement"] == pytest.approx(47 / 62) and 0 < cmp["kappa"] < 1
    with engine.connect() as conn:
        assert conn.execute(sa.text(calls)).scalar_one() == 124
        # Gold texts live in posts only: not in results, the ledger or dead letters.
        texts = [r.post.text for r in read_gold(GOLD, "eval").rows]
        dump = json.dumps(
            [
                [list(r) for r in conn.execute(sa.text(f"SELECT * FROM {table}")).all()]
                for table in ("results", "ledger_events", "dead_letters", "policy_evaluations")
            ],
            default=str,
        )
    assert not [t for t in texts if t and t in dump]


# SQLite only: CLI flows; the store queries behind them run on both stores above.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_customer_tenant_is_refused_and_gold_stays_out_of_the_backfill(
    engine: Engine, env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load(engine, tmp_path, {"acme": 10})
    code, _, err = _cli(["evaluate", str(GOLD), "--tenant", "acme"], capsys)
    assert code == 2 and "customer" in err
    assert _cli(["evaluate", str(GOLD), "--tenant", "lab-1", "--json"], capsys)[0] == 0
    # An import cannot add posts to the gold tenant; the backfill and verify leave it out.
    got = import_records(engine, tmp_path, [{"tenant_id": "lab-1", "post_id": "x", "text": "t"}])
    assert got.rejected == 1
    code, doc, _ = _cli(["dry-run", "--json"], capsys)
    assert [t["tenant"] for t in doc["tenants"]] == ["acme"]
    code, doc, _ = _cli(["run", "--json"], capsys)
    assert code == 0 and {p["partition"].split("|")[1] for p in doc["partitions"]} == {"acme"}
    code, doc, _ = _cli(["verify", "--require-complete", "--json"], capsys)
    assert code == 0 and doc["ok"], doc["problems"]


# SQLite only: CLI flows; the store queries behind them run on both stores above.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_gate_refuses_run_and_launch_and_its_check_fails(
    engine: Engine,
    env: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    load(engine, tmp_path, {"acme": 10})
    monkeypatch.setenv("BACKFILL_POLICY_MIN_MACRO_F1", "0.9")
    for argv in (["run"], ["launch", "--stale", "--url", "http://127.0.0.1:9"]):
        code, _, err = _cli(argv, capsys)
        assert code == 2 and "BACKFILL_POLICY_MIN_MACRO_F1=0.9" in err and "no evaluation" in err
    code, doc, _ = _cli(["evaluate", str(GOLD), "--json"], capsys)
    assert code == 0 and doc["gate"]["passed"] is False  # macro-F1 0.853 < 0.9
    code, _, err = _cli(["run"], capsys)
    assert code == 2 and "macro-F1 0.853" in err
    with engine.connect() as conn:
        sent = conn.execute(sa.text("SELECT count(*) FROM ledger_events WHERE tenant_id = 'acme'"))
        assert sent.scalar_one() == 0
    # The UI: evaluate recorded policy_evaluation and its failing gate check.
    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    try:
        key = dg.AssetCheckKey(POLICY_EVALUATION, GATE_CHECK)
        found = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
        assert found is not None and found.event is not None
        assert found.event.dagster_event.event_specific_data.passed is False
        mat = instance.get_latest_materialization_event(POLICY_EVALUATION)
        assert mat is not None
        md = mat.asset_materialization.metadata  # type: ignore[union-attr]
        assert "course-rubric@5#" in md["evaluations"].value and md["macro_f1"].value < 0.9
        # Materialised from the UI, the asset shows the same and its check fails the same way.
        defs = build_definitions({**env, "BACKFILL_POLICY_MIN_MACRO_F1": "0.9"})
        result = dg.materialize(
            [defs.resolve_assets_def("policy_evaluation")],
            instance=instance,
            raise_on_error=False,
        )
        [check] = result.get_asset_check_evaluations()
        assert check.passed is False and "0.853" in (check.description or "")
    finally:
        instance.dispose()
    # A lower bar passes: run goes ahead.
    monkeypatch.setenv("BACKFILL_POLICY_MIN_MACRO_F1", "0.8")
    code, doc, _ = _cli(["run", "--json"], capsys)
    assert code == 0 and doc["totals"]["model_calls"] == 10


def test_a_gold_set_too_small_for_a_label_never_passes_the_gate(
    engine: Engine,
    env: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One gold row scores macro-F1 1.0 on the labels it holds; the gate wants every label of
    the policy BACKFILL_POLICY_MIN_SUPPORT times (default 5) and says why it refuses."""
    load(engine, tmp_path, {"acme": 3})
    one = tmp_path / "one.csv"
    one.write_text("id,text,label,rule\ng1,just a question about loops,ok,\n")
    monkeypatch.setenv("BACKFILL_POLICY_MIN_MACRO_F1", "0.99")
    code, doc, _ = _cli(["evaluate", str(one), "--json"], capsys)
    assert code == 0 and doc["policies"][0]["macro_f1"] == 1.0
    assert doc["gate"]["passed"] is False
    summary = doc["gate"]["summary"]
    assert "not enough gold data" in summary and "BACKFILL_POLICY_MIN_SUPPORT=5" in summary
    assert "ok 1" in summary and "spam 0" in summary
    code, _, err = _cli(["run"], capsys)
    assert code == 2 and "not enough gold data" in err
    # The full course gold set holds at least 6 rows of every label: the default lets it
    # through, a bar of 7 does not.
    monkeypatch.setenv("BACKFILL_POLICY_MIN_MACRO_F1", "0.8")
    assert _cli(["evaluate", str(GOLD), "--json"], capsys)[1]["gate"]["passed"] is True
    monkeypatch.setenv("BACKFILL_POLICY_MIN_SUPPORT", "7")
    code, doc, _ = _cli(["evaluate", str(GOLD), "--json"], capsys)
    assert doc["gate"]["passed"] is False and "needs_review 6" in doc["gate"]["summary"]


# SQLite only: CLI flows; the store queries behind them run on both stores above.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_run_sample_is_a_canary_the_full_run_does_not_pay_again(
    engine: Engine, env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load(engine, tmp_path, {"acme": 40, "globex": 30}, spam_every=4)
    code, doc, _ = _cli(["run", "--sample", "8", "--json"], capsys)
    assert code == 0
    by = {t["tenant"]: t for t in doc["tenants"]}
    assert {t: (v["sampled"], v["calls"]) for t, v in by.items()} == {
        "acme": (8, 8),
        "globex": (8, 8),
    }
    assert sum(by["acme"]["labels"].values()) == 8
    assert sum(by["acme"]["shares"].values()) == pytest.approx(1.0)
    assert "live_shares" in by["acme"]
    again = _cli(["run", "--sample", "8", "--json"], capsys)[1]
    assert [t["calls"] for t in again["tenants"]] == [0, 0]  # the same sample: nothing to pay
    code, doc, _ = _cli(["run", "--json"], capsys)
    assert code == 0 and doc["totals"]["model_calls"] == 70 - 16


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _ece_of(bins: list[dict[str, Any]]) -> float:
    n = sum(b["count"] for b in bins)
    return sum(b["count"] / n * abs(b["accuracy"] - b["mean_score"]) for b in bins if b["count"])


# SQLite only: a CLI flow; the store queries behind it run on both stores above.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_calibration_is_the_stored_confidences_against_the_gold_labels(
    engine: Engine, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc, _ = _cli(["evaluate", str(GOLD), "--json"], capsys)
    assert code == 0
    [v5] = doc["policies"]
    cal = v5["calibration"]
    assert (cal["score"], cal["rows"], cal["scored_rows"], cal["bins"]) == (
        "confidence",
        62,
        62,
        10,
    )
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT confidence FROM results")).scalars().all()
    # The bins hold the stored confidences: the same count and sum ([lower, upper), the last
    # bin closed).
    bins = cal["overall"]["reliability"]
    counts = [
        sum(1 for s in stored if b["lower"] <= s < b["upper"] or (k == 9 and s == 1.0))
        for k, b in enumerate(bins)
    ]
    assert counts == [b["count"] for b in bins] and sum(counts) == 62
    total = sum(b["mean_score"] * b["count"] for b in bins if b["count"])
    assert total == pytest.approx(sum(stored))
    # Right in the bins: the accuracy's 52 of 62.
    right = sum(round(b["accuracy"] * b["count"]) for b in bins if b["count"])
    assert right == 52
    assert cal["overall"]["ece"] == pytest.approx(_ece_of(bins)) and cal["overall"]["ece"] > 0
    # At threshold 0 every labelled row is predicted: the label's precision and recall; above
    # every confidence (the fake model's are at most 0.99) none is.
    figures = _by_label(v5)
    for c in cal["labels"]:
        got = figures[c["label"]]
        assert c["rows"] == got["predicted"] and c["pr"]["positives"] == got["support"]
        assert c["pr"]["precision"][0] == pytest.approx(got["precision"])
        assert c["pr"]["recall"][0] == pytest.approx(got["recall"])
        assert (c["pr"]["predicted"][-1], c["pr"]["precision"][-1]) == (0, None)
        assert c["pr"]["recall"][-1] == 0.0
    assert cal["thresholds"][:3] == [0.0, 0.01, 0.02] and len(cal["thresholds"]) == 101
    # The human output: overall ECE, its bins, each label's ECE; the PR table is left out.
    code, out, _ = _cli(["evaluate", str(GOLD)], capsys)
    assert f"calibration (score: confidence): ECE {cal['overall']['ece']:.3f}" in out
    assert "reliability (bins with rows)" in out and "ECE per label" in out
    assert "precision_recall" not in out


# SQLite only: a CLI flow; the store queries behind it run on both stores above.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_report_writes_the_pictures_and_policy_evaluation_links_them(
    engine: Engine, env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "reports" / "v5"  # made, parents too
    code, doc, err = _cli(["evaluate", str(GOLD), "--report", str(folder), "--json"], capsys)
    assert code == 0, err
    pictures = ["confusion_matrix.png", "reliability.png", "precision_recall.png"]
    assert doc["report"] == {
        "dir": str(folder),
        "files": [str(folder / n) for n in [*pictures, "calibration.json"]],
    }
    for name in pictures:
        data = (folder / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, name
    [v5] = doc["policies"]
    assert json.loads((folder / "calibration.json").read_text()) == v5["calibration"]
    with engine.connect() as conn:
        dirs = conn.execute(sa.text("SELECT report_dir FROM policy_evaluations")).scalars().all()
    assert dirs == [str(folder)]

    # The UI: evaluate's own record of policy_evaluation, and the asset materialised, link
    # the pictures and carry the overall ECE.
    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    try:
        for materialise in (False, True):
            if materialise:
                defs = build_definitions(env)
                result = dg.materialize(
                    [defs.resolve_assets_def("policy_evaluation")], instance=instance
                )
                assert result.success
            mat = instance.get_latest_materialization_event(POLICY_EVALUATION)
            assert mat is not None and mat.asset_materialization is not None
            md = mat.asset_materialization.metadata
            for name in pictures:
                link = md[name.replace(".", "_")]
                assert isinstance(link, dg.PathMetadataValue) and link.path == str(folder / name)
            assert md["report_dir"].value == str(folder)
            assert md["ece"].value == pytest.approx(v5["calibration"]["overall"]["ece"])
            assert "| overall | 62 |" in md["calibration"].value
    finally:
        instance.dispose()

    # A later evaluation without --report links no pictures; its ECE is still shown.
    code, doc, _ = _cli(["evaluate", str(GOLD), "--json"], capsys)
    assert code == 0 and "report" not in doc
    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    try:
        mat = instance.get_latest_materialization_event(POLICY_EVALUATION)
        md = mat.asset_materialization.metadata  # type: ignore[union-attr]
        assert "reliability_png" not in md and "report_dir" not in md and "ece" in md
    finally:
        instance.dispose()


# SQLite only: a CLI flow; the store queries behind it run on both stores above.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_report_with_against_puts_the_baseline_in_its_subfolder(
    engine: Engine, env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "r"
    argv = ["evaluate", str(GOLD), "--against", str(COURSE_V4), "--report", str(folder)]
    code, doc, err = _cli([*argv, "--json"], capsys)
    assert code == 0, err
    v4, v5 = doc["policies"]
    assert json.loads((folder / "calibration.json").read_text()) == v5["calibration"]
    assert json.loads((folder / "against" / "calibration.json").read_text()) == v4["calibration"]
    assert (folder / "against" / "reliability.png").read_bytes().startswith(PNG_MAGIC)


# SQLite only: a CLI flow; the store queries behind it run on both stores above.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_report_folder_that_cannot_be_made_is_refused_before_any_call(
    engine: Engine,
    env: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    taken = tmp_path / "taken.txt"
    taken.write_text("mine")
    folder = taken if where == "a file" else taken / "report"
    code, _, err = _cli(["evaluate", str(GOLD), "--report", str(folder)], capsys)
    assert code == 2 and "argument --report" in err and "not a folder" in err, err
    assert taken.read_text() == "mine"
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM ledger_events")).scalar_one() == 0
