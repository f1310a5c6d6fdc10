"""Moderators' decisions outrank the model through the whole CLI, on both stores (issue 50):
a decision survives ``run --force``, a relabel from stored results and a cascade's re-route;
the sink row follows the decision once the next run fills the gap ``verify`` names; a decision
about a post another tenant holds is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_tests.cli.test_cascade_cli import _cascade
from backfill_tests.cli.test_cascade_cli import cascade as cascade
from backfill_tests.cli.test_moderation_dialect_cli import moderated as moderated
from backfill_tests.cli_runs import last_json
from backfill_tests.conftest import import_records, write_jsonl
from backfill_tests.platform_db.test_sink import sink_rows
from backfill_tests.platform_db.test_sink import sink_url as sink_url

POSTS = [
    {"tenant_id": t, "post_id": f"p{i}", "text": f"post {i} of {t}, thanks for the write-up"}
    for t in ("acme", "globex")
    for i in range(12)
]


def _import(tmp_path: Path, capsys: pytest.CaptureFixture[str], *rows: dict[str, Any]) -> Any:
    path = write_jsonl(
        tmp_path / f"decisions-{len(list(tmp_path.glob('decisions-*')))}.jsonl", rows
    )
    capsys.readouterr()
    code = main(["decisions", "import", str(path), "--json"])
    doc = last_json(capsys.readouterr().out)
    assert code == 0, doc
    return doc


def _decision(tenant: str, post: str, label: str, policy: str, version: str, **over: Any) -> Any:
    return {
        "tenant_id": tenant,
        "post_id": post,
        "policy_id": policy,
        "policy_version": version,
        "label": label,
        "rule_ids": [],
        "reviewer_id": "mod-3",
        "decided_at": "2026-12-01T09:00:00Z",
        **over,
    }


def _in_force(engine: Engine, tenant: str, post: str) -> tuple[str, str]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT label, source FROM applied_labels WHERE tenant_id = :t AND post_id = :p"
            ),
            {"t": tenant, "p": post},
        ).one()
    return str(row[0]), str(row[1])


def test_a_decision_survives_force_and_reaches_the_sink(
    engine: Engine,
    cli_store: dict[str, str],
    sink_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("BACKFILL_SINK_URL", sink_url)
    import_records(engine, tmp_path, POSTS)
    assert main(["run"]) == 0
    model_label = _in_force(engine, "acme", "p3")
    assert model_label == ("ok", "model")
    doc = _import(tmp_path, capsys, _decision("acme", "p3", "spam", "default", "1"))
    assert doc["imported"] == 1 and doc["applied"] == 1
    assert _in_force(engine, "acme", "p3") == ("spam", "human")
    # The sink still holds the model's label: verify names the gap, the next run fills it.
    assert main(["verify", "--require-complete", "--json"]) != 0
    assert "sink_pending" in capsys.readouterr().out
    assert main(["run"]) == 0
    rows = sink_rows(sink_url)
    assert rows[("acme", "p3", "default")]["label"] == "spam"
    assert rows[("acme", "p3", "default")]["source"] == "human"
    assert rows[("acme", "p4", "default")]["source"] == "model"
    # --force runs and re-applies every partition: the decision stays, here and in the sink.
    assert main(["run", "--force"]) == 0
    assert _in_force(engine, "acme", "p3") == ("spam", "human")
    assert sink_rows(sink_url)[("acme", "p3", "default")]["label"] == "spam"
    assert main(["verify", "--require-complete", "--json"]) == 0
    # A decision naming globex for a post only acme holds is refused, and changes nothing.
    before = sink_rows(sink_url)
    doc = _import(tmp_path, capsys, _decision("globex", "p99", "spam", "default", "1"))
    assert doc["rejected"] == 1 and doc["imported"] == 0
    assert _in_force(engine, "globex", "p3") == ("ok", "model")
    assert main(["run"]) == 0 and sink_rows(sink_url) == before


def test_a_decision_survives_a_relabel_from_stored_results(
    engine: Engine,
    moderated: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _sim, policy = moderated
    assert main(["run"]) == 0
    # "people like them are vermin" (p2) is abuse under the shipped thresholds.
    assert _in_force(engine, "acme", "p2") == ("abuse", "model")
    _import(tmp_path, capsys, _decision("acme", "p2", "threat", "forum", "1", rule_ids=["V-1"]))
    text = policy.read_text(encoding="utf-8")
    policy.write_text(
        text.replace(
            "hate: {label: abuse, rule: H-2, threshold: 0.4}",
            "hate: {label: abuse, rule: H-2, threshold: 0.5}",
        ),
        encoding="utf-8",
    )
    assert main(["run"]) == 0
    assert "relabelled from stored results" in capsys.readouterr().out
    # globex's copy follows the new threshold; acme's stays the moderator's.
    assert _in_force(engine, "globex", "p2") == ("ok", "model")
    assert _in_force(engine, "acme", "p2") == ("threat", "human")


def test_a_decision_survives_a_cascade_reroute(
    engine: Engine,
    cascade: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _sim, path = cascade
    assert main(["run"]) == 0
    # "see you at the meetup" (p6) is decided ok at the screen under 0.97.
    assert _in_force(engine, "acme", "p6") == ("ok", "model")
    _import(tmp_path, capsys, _decision("acme", "p6", "abuse", "forum", "1", rule_ids=["H-1"]))
    path.write_text(_cascade(0.99), encoding="utf-8")
    assert main(["run"]) == 0
    out = capsys.readouterr().out
    assert "re-routed from stored results" in out, out
    assert _in_force(engine, "acme", "p6") == ("abuse", "human")
    assert _in_force(engine, "globex", "p6")[1] == "model"
    # The export lists the decision beside the model's labels, with its source.
    out_dir = tmp_path / "out"
    assert main(["export", "--format", "jsonl", "--out", str(out_dir), "--tenant", "acme"]) == 0
    rows = [json.loads(x) for x in (out_dir / "acme.jsonl").read_text().splitlines()]
    human = [r for r in rows if r["source"] == "human"]
    assert [(r["post_id"], r["label"], r["model"]) for r in human] == [("p6", "abuse", "human")]
