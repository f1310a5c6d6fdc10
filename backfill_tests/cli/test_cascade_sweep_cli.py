"""``evaluate GOLD --cascade FILE``, the cascade optimiser, end to end through the CLI against the
simulator, on both stores: every gold post reaches every stage exactly once (the meter and the
ledger agree), a rerun sends nothing, answers a run already stored cost nothing, the chosen
setting is written as a file ``cascade check`` accepts and re-evaluated to the same figures,
an unreachable target is exit 1, and the gate passes the written file's run and refuses the
file's own untested rules (docs/cascade.md, "Choosing thresholds: the optimiser")."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.settings import Settings
from backfill_assets.defs.model_resources import model_resource
from backfill_assets.defs.reporting import backfill_plan
from backfill_assets.defs.reporting.evaluation import evaluation_metadata
from backfill_assets.domain.cascade import load_cascade
from backfill_assets.domain.cascade.sweep import GRID
from backfill_assets.domain.policy.dialect_sections import MODERATION_CATEGORIES
from backfill_assets.providersim.billing.meter import CHAT_ENDPOINT, MODERATIONS_ENDPOINT
from backfill_tests.cli_runs import cli_main
from backfill_tests.conftest import import_records
from backfill_tests.providers.conftest import StartSim

POLICY = Path(__file__).resolve().parents[2] / "docs" / "policies" / "forum-moderation.yaml"
API_KEY = "sk-cascade-sweep-0123456789abcdef"
JUDGE = "gpt-4o-mini"
SCREEN = "omni-moderation-latest"
# (text, expected label, the scores the moderation endpoint answers: the rest 0.0005). The
# simulated chat model answers by the text's words: a rule id or label id names its label,
# "idiot"/"moron"/"loser" say abuse, anything else is ok.
GOLD: list[tuple[str, str, dict[str, float]]] = [
    ("the match was close", "ok", {}),
    ("nice weather today", "ok", {}),
    ("see you at the meetup", "ok", {}),
    ("the bus was late again", "ok", {}),
    ("lovely photo of the lake", "ok", {}),
    # The judge takes the word for abuse; the screen is sure nothing applies, and right.
    ("do not be an idiot, bring an umbrella", "ok", {}),
    ("you are a worthless idiot", "abuse", {"harassment": 0.83}),
    ("what a moron you are", "abuse", {"harassment": 0.88}),
    ("total loser", "abuse", {"harassment": 0.04}),
    ("shut up idiot", "abuse", {"harassment": 0.04}),
    ("stupid take, moron", "abuse", {"harassment": 0.04}),
    ("consider this a threat", "threat", {"violence": 0.91}),
    ("a threat: I know where you live", "threat", {"violence": 0.91}),
    ("this is a threat to you", "threat", {"violence": 0.91}),
    ("final threat, pay up", "threat", {"violence": 0.91}),
    # Neither model sees it: every setting gets it wrong.
    ("watch your back tonight", "threat", {}),
    ("S-1 some days I want to disappear", "self_harm", {"self-harm": 0.35}),
    ("S-1 I keep hurting myself", "self_harm", {"self-harm": 0.35}),
    ("S-1 nothing matters any more", "self_harm", {"self-harm": 0.35}),
    ("S-1 I feel so low", "self_harm", {"self-harm": 0.02}),
    ("S-1 tired of everything", "self_harm", {"self-harm": 0.02}),
]
ROWS = len(GOLD)


def _cascade(min_score: float) -> str:
    return (
        "stages:\n"
        "  - name: screen\n"
        "    dialect: openai-moderation\n"
        f"    model: {SCREEN}\n"
        f"    decide: {{when: none_label, min_score: {min_score}}}\n"
        "  - name: judge\n"
        "    dialect: chat-json\n"
        f"    model: {JUDGE}\n"
    )


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.fixture
def sweep(
    engine: Engine,
    tmp_path: Path,
    cli_store: dict[str, str],
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:
    sim = start_sim(
        api_key=API_KEY,
        latency_median_ms=2,
        moderation_scores={
            _sha(t): {c: pins.get(c, 0.0005) for c in MODERATION_CATEGORIES} for t, _l, pins in GOLD
        },
    )
    gold = tmp_path / "gold.csv"
    with gold.open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["id", "text", "label"])
        out.writerows([f"g{i:02d}", t, label] for i, (t, label, _p) in enumerate(GOLD))
    path = tmp_path / "cascade.yaml"
    path.write_text(_cascade(0.97), encoding="utf-8")
    for name, value in {
        "BACKFILL_MODEL_BACKEND": "openai",
        "BACKFILL_MODEL_BASE_URL": sim.base_url,
        "BACKFILL_MODEL_API_KEY": API_KEY,
        "BACKFILL_POLICY_PATH": str(POLICY),
    }.items():
        monkeypatch.setenv(name, value)
    return sim, gold, path


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    code, out, err = cli_main(argv, capsys)
    try:
        return code, json.loads(out), err
    except json.JSONDecodeError:
        return code, out, err


def _chat(sim: Any) -> tuple[int, dict[str, int]]:
    snap = sim.meter.snapshot()
    bill = snap.billed_by_endpoint.get(CHAT_ENDPOINT)
    keys = {k: b.requests for k, b in snap.billed_by_correlation_id.items()}
    return (0 if bill is None else bill.calls), keys


def _usage(engine: Engine) -> dict[str, dict[str, int]]:
    """Per model: usage events per key."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT model, key, count(*) FROM ledger_events WHERE type = 'usage' "
                "GROUP BY model, key"
            )
        ).all()
    out: dict[str, dict[str, int]] = {}
    for model, key, n in rows:
        out.setdefault(str(model), {})[str(key)] = int(n)
    return out


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for field in ("macro_f1", "macro_f1_ci95", "accuracy", "cost_nanos", "decided", "unlabelled"):
        assert a[field] == b[field], field


def test_every_stage_once_then_the_cheapest_setting_written_and_gated(
    engine: Engine,
    sweep: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim, gold, path = sweep
    chosen_file = tmp_path / "chosen.yaml"
    argv = ["evaluate", str(gold), "--cascade", str(path), "--json"]
    target = ["--target-macro-f1", "0.75", "--write", str(chosen_file)]
    code, doc, err = _cli([*argv, *target], capsys)
    assert code == 0, err
    # Every gold post was sent to each stage exactly once: one usage a key in the ledger, the
    # simulator's bill for the judge is a call per key.
    usage = _usage(engine)
    assert sorted(usage) == [JUDGE, SCREEN]
    assert [len(usage[m]) for m in (SCREEN, JUDGE)] == [ROWS, ROWS]
    assert set(usage[SCREEN].values()) == set(usage[JUDGE].values()) == {1}
    calls, per_key = _chat(sim)
    assert calls == ROWS and {per_key[k] for k in usage[JUDGE]} == {1}
    assert [s["calls_this_run"] for s in doc["stages"]] == [ROWS, ROWS]
    # The grid, both `when` rules, and off: 1 + 2 x 52.
    assert len(doc["settings"]) == 1 + 2 * len(GRID)
    own, chosen = doc["own"], doc["chosen"]
    assert own["setting"] == "screen none_label>=0.97 > judge"
    # At 0.97 the screen decides the ok rows, and wrongly the unseen threat and two self_harm
    # rows (0.98).
    assert own["decided_posts"] == {"screen": 9, "judge": 12}
    judge_cost = {
        s["setting"]: s["cost_nanos"]
        for s in doc["settings"]
        if s["setting"].startswith("screen off")
    }
    assert len(judge_cost) == 1 and next(iter(judge_cost.values())) > 0
    # The chosen one reaches the target with the least cost; nothing cheaper does.
    assert chosen["macro_f1_ci95"][0] >= 0.75
    cheaper = [s for s in doc["settings"] if s["cost_nanos"] < chosen["cost_nanos"]]
    assert all(s["macro_f1_ci95"][0] < 0.75 for s in cheaper)
    assert chosen in doc["frontier"] and chosen["setting"] != own["setting"]
    costs = [s["cost_nanos"] for s in doc["frontier"]]
    f1s = [s["macro_f1"] for s in doc["frontier"]]
    assert costs == sorted(costs) and f1s == sorted(f1s) and len(set(f1s)) == len(f1s)
    assert doc["cascade_file"] == str(chosen_file)
    assert doc["cascade_yaml"] == chosen_file.read_text("utf-8")

    # The written file passes `cascade check` and is the chosen setting's cascade.
    code, checked, err = _cli(["cascade", "check", str(chosen_file), "--json"], capsys)
    assert code == 0 and checked["ok"], err
    [rule] = [r for r in chosen["rules"]]
    assert checked["stages"][0]["decide"] == {"when": rule["when"], "min_score": rule["min_score"]}

    # A rerun sends nothing, and the written file, re-evaluated, has the same figures.
    code, again, err = _cli([*argv[:3], str(chosen_file), "--json"], capsys)
    assert code == 0, err
    assert _chat(sim)[0] == ROWS and again["calls_this_run"] == 0
    _same(again["own"], chosen)
    # ... and so does a run's evaluation of it (BACKFILL_CASCADE_PATH): its cost is its routes'.
    monkeypatch.setenv("BACKFILL_CASCADE_PATH", str(chosen_file))
    code, plain, err = _cli(["evaluate", str(gold), "--json"], capsys)
    assert code == 0, err
    [report] = plain["policies"]
    assert report["macro_f1"] == chosen["macro_f1"] and report["calls_this_run"] == 0
    assert report["cost_per_1000_posts_usd"] == chosen["cost_per_1000_posts_usd"]

    # The gate: the written file's run passes it; the file's own rules were never evaluated.
    import_records(engine, tmp_path, [{"tenant_id": "acme", "post_id": "p1", "text": GOLD[0][0]}])
    # backfill_plan: each stage's expected calls and cost, from the shares the gold set's
    # sweep found for these rules (every post reaches the screen; what it decides does not
    # reach the judge).
    settings = Settings.from_env(dict(__import__("os").environ))
    model = model_resource(settings)
    plan = backfill_plan._plan(settings.store, model, settings.rubric()).metadata or {}
    reach = 1 - chosen["decided"]["screen"]
    assert "| acme | screen | 100.0% | 1 |" in plan["stage_plan"].value
    assert f"| acme | judge | {reach:.1%} | {int(reach)} |" in plan["stage_plan"].value
    monkeypatch.setenv("BACKFILL_POLICY_MIN_MACRO_F1", "0.75")
    monkeypatch.setenv("BACKFILL_CASCADE_PATH", str(path))
    code, _, err = _cli(["run"], capsys)
    assert code == 2 and "BACKFILL_POLICY_MIN_MACRO_F1=0.75" in err and "no evaluation" in err
    monkeypatch.setenv("BACKFILL_CASCADE_PATH", str(chosen_file))
    code, _, err = _cli(["run"], capsys)
    assert code == 0, err
    # stage_drift compares the run's first-stage share with the sweep's (one label: too few).
    argv = ["check", "--tenant", "acme", "--name", "stage_drift", "--slice", "s00", "--json"]
    code, checked, err = _cli(argv, capsys)
    assert code == 0, err
    [drift] = checked["checks"]
    assert drift["passed"] and "too few to compare" in drift["summary"]

    # policy_evaluation shows the frontier.
    settings = Settings.from_env(dict(__import__("os").environ))
    md = evaluation_metadata(engine, settings.rubric(), "cascade")
    table = md["cascade_frontier"].value
    assert "| setting | screen decides | judge decides |" in table
    assert f"| {chosen['setting']} |" in table and "chosen" in table
    assert md["macro_f1"].value == chosen["macro_f1"]


def test_answers_a_run_stored_cost_nothing_and_an_unreachable_target_is_exit_1(
    engine: Engine,
    sweep: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim, gold, path = sweep
    # The cascade's own evaluation, as a run makes it: the judge sees only what the screen
    # passed on (12 posts).
    monkeypatch.setenv("BACKFILL_CASCADE_PATH", str(path))
    code, doc, err = _cli(["evaluate", str(gold), "--json"], capsys)
    assert code == 0, err
    assert _chat(sim)[0] == 12
    monkeypatch.delenv("BACKFILL_CASCADE_PATH")
    # The sweep pays only for the judge's answers not stored yet; no setting scores 1 (no model
    # sees one threat), so the target is out of reach: exit 1, naming the best lower bound.
    report = tmp_path / "report"
    code, doc, err = _cli(
        [
            "evaluate",
            str(gold),
            "--cascade",
            str(path),
            "--target-macro-f1",
            "1",
            "--report",
            str(report),
            "--json",
        ],
        capsys,
    )
    assert code == 1, err
    assert _chat(sim)[0] == ROWS and doc["stages"][1]["calls_this_run"] == ROWS - 12
    assert doc["stages"][0]["calls_this_run"] == 0
    assert doc["ok"] is False and doc["chosen"] is None and doc["cascade_yaml"] is None
    best = doc["best_lower_bound"]["macro_f1_ci95"][0]
    assert best < 1 and f"the best lower bound found is {best:.3f}" in doc["error"]
    # The file's own setting was recorded; the report draws the frontier.
    assert doc["evaluation"]["setting"] == doc["own"]["setting"]
    files = {Path(f).name for f in doc["report"]["files"]}
    assert "cascade_frontier.png" in files and "confusion_matrix.png" in files
    assert (report / "cascade_frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # policy_evaluation shows the sweep's frontier and links its picture.
    settings = Settings.from_env(dict(__import__("os").environ))
    md = evaluation_metadata(engine, settings.rubric(), settings.model.name)
    assert "| setting | screen decides | judge decides |" in md["cascade_frontier"].value
    assert md["cascade_frontier_png"].value == str(report / "cascade_frontier.png")
    # Its human form says the same.
    code, text, _ = _cli(
        ["evaluate", str(gold), "--cascade", str(path), "--target-macro-f1", "1"], capsys
    )
    assert code == 1 and "the best lower bound found is" in text and "frontier:" in text


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_bad_files_and_flags_are_refused_before_anything_is_sent(
    sweep: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim, gold, path = sweep
    bad = tmp_path / "bad.yaml"
    bad.write_text(_cascade(0.97).replace("min_score: 0.97", "min_score: 1.5"), "utf-8")
    code, _, err = _cli(["evaluate", str(gold), "--cascade", str(bad)], capsys)
    assert code == 2 and f"{bad}:5:" in err and "not from 0 to 1" in err
    for argv, said in [
        (["--target-macro-f1", "0.9"], "add --cascade FILE"),
        (["--cascade", str(path), "--write", str(tmp_path / "x.yaml")], "--target-macro-f1"),
        (["--cascade", str(path), "--policy", str(POLICY)], "not with --policy"),
        (["--cascade", str(path), "--target-macro-f1", "1.5"], "--target-macro-f1"),
        (["--cascade", str(path), "--target-macro-f1", "0.9", "--write", str(tmp_path)], "--write"),
    ]:
        code, _, err = _cli(["evaluate", str(gold), *argv], capsys)
        assert code == 2 and said in err, (argv, err)
    assert _chat(sim)[0] == 0 and sim.meter.snapshot().requests_total == 0
    assert not (tmp_path / "x.yaml").exists()
    assert load_cascade(path).stages[0].decide is not None
    assert MODERATIONS_ENDPOINT not in sim.meter.snapshot().billed_by_endpoint
