"""``run`` in the ``openai-moderation`` dialect, end to end through the CLI against the
simulator's ``POST /v1/moderations``, on both stores: labels as the policy maps the scores,
the ledger equal to the simulator's meter, a rerun that sends nothing, a changed threshold
that is new (free) work, and a hostile answer that is a dead letter, not a label."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.domain.policy.dialect_sections import MODERATION_CATEGORIES
from backfill_assets.providersim.billing.meter import MODERATIONS_ENDPOINT
from backfill_tests.cli_runs import clean_env, run_cli, unanswered_attempts
from backfill_tests.conftest import import_records
from backfill_tests.providers.conftest import StartSim

POLICY = Path(__file__).resolve().parents[2] / "docs" / "policies" / "forum-moderation.yaml"
MODEL = "omni-moderation-latest"
API_KEY = "sk-mod-cli-0123456789abcdef"
# Post text -> the scores the simulator answers for it (the rest of the 13 stay near 0).
PINNED: dict[str, dict[str, float]] = {
    "I will find you and hurt you": {"violence": 0.91, "harassment/threatening": 0.62},
    "you are a worthless idiot": {"harassment": 0.83},
    "people like them are vermin": {"hate": 0.45, "harassment": 0.3},
    "some days I want to disappear": {"self-harm": 0.35, "self-harm/intent": 0.2},
    "the match was close": {},
}
EXPECTED = {
    "I will find you and hurt you": ("threat", "V-1"),
    "you are a worthless idiot": ("abuse", "H-1"),
    "people like them are vermin": ("abuse", "H-2"),
    "some days I want to disappear": ("self_harm", "S-1"),
    "the match was close": ("ok", ""),
}
POSTS = [
    {"tenant_id": tenant, "post_id": f"p{i}", "text": text}
    for tenant in ("acme", "globex")
    for i, text in enumerate(PINNED)
]


def _scores(pins: dict[str, float]) -> dict[str, float]:
    return {c: pins.get(c, 0.001) for c in MODERATION_CATEGORIES}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.fixture
def moderated(
    engine: Engine,
    tmp_path: Path,
    cli_store: dict[str, str],
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:
    import_records(engine, tmp_path, POSTS)
    sim = start_sim(
        api_key=API_KEY,
        strict_models=True,
        moderation_scores={_sha(t): _scores(p) for t, p in PINNED.items()},
    )
    policy = tmp_path / "forum.yaml"
    policy.write_text(POLICY.read_text(encoding="utf-8"), encoding="utf-8")
    for name, value in {
        "BACKFILL_MODEL_BACKEND": "openai",
        "BACKFILL_MODEL_DIALECT": "openai-moderation",
        "BACKFILL_MODEL": MODEL,
        "BACKFILL_MODEL_BASE_URL": sim.base_url,
        "BACKFILL_MODEL_API_KEY": API_KEY,
        "BACKFILL_POLICY_PATH": str(policy),
    }.items():
        monkeypatch.setenv(name, value)
    return sim, policy


def _labels(engine: Engine) -> dict[tuple[str, str], tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT r.tenant_id, p.text, r.label, r.rule_ids FROM results r "
                "JOIN posts p ON p.tenant_id = r.tenant_id AND p.post_id = r.post_id "
                "WHERE r.key_version LIKE '%+openai-moderation'"
            )
        ).all()
    return {(t, text): (label, rules) for t, text, label, rules in rows}


def _ledger(engine: Engine) -> tuple[int, int, int]:
    """Usage events, their tokens and their cost."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT count(*), coalesce(sum(tokens_in + tokens_out), 0), "
                "coalesce(sum(cost_nanos), 0) FROM ledger_events WHERE type = 'usage'"
            )
        ).one()
    return int(row[0]), int(row[1]), int(row[2])


def _requests(engine: Engine) -> int:
    """The distinct requests the usage events were booked from, one tenant's each."""
    with engine.connect() as conn:
        per = conn.execute(
            sa.text(
                "SELECT request_id, count(DISTINCT tenant_id) FROM ledger_events "
                "WHERE type = 'usage' GROUP BY request_id"
            )
        ).all()
    assert all(n == 1 for _r, n in per)
    return len(per)


def _settled(sim: Any) -> tuple[int, int]:
    """The meter once a killed client's last request has been answered (billed on answer)."""
    seen = _meter(sim)
    while True:
        time.sleep(0.3)
        now = _meter(sim)
        if now == seen:
            return now
        seen = now


def _meter(sim: Any) -> tuple[int, int]:
    bill = sim.meter.snapshot().billed_by_endpoint.get(MODERATIONS_ENDPOINT)
    return (0, 0) if bill is None else (bill.calls, bill.cost_nanos)


def test_a_backfill_maps_the_scores_and_the_ledger_equals_the_meter(
    engine: Engine, moderated: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    sim, policy = moderated
    assert main(["run"]) == 0
    labels = _labels(engine)
    assert labels == {(t, text): EXPECTED[text] for t in ("acme", "globex") for text in PINNED}
    assert _applied(engine) == labels
    calls, tokens, cost = _ledger(engine)
    assert (calls, tokens, cost) == (len(POSTS), 0, 0)
    # A request carries several posts of one tenant: the meter's calls are the ledger's
    # distinct requests, never one joining two tenants.
    assert _meter(sim) == (_requests(engine), cost)
    assert _requests(engine) < len(POSTS)
    # Nothing is left to do: a rerun sends nothing.
    sent = _meter(sim)
    assert main(["run"]) == 0
    assert _meter(sim) == sent and _ledger(engine)[0] == len(POSTS)
    # A higher threshold is not new work: the section is not sent, so the stored scores are
    # read again under it, without a call.
    text = policy.read_text(encoding="utf-8")
    policy.write_text(
        text.replace(
            "hate: {label: abuse, rule: H-2, threshold: 0.4}",
            "hate: {label: abuse, rule: H-2, threshold: 0.5}",
        ),
        encoding="utf-8",
    )
    assert main(["run"]) == 0
    assert _ledger(engine)[0] == len(POSTS) and _meter(sim) == sent
    assert f"relabelled from stored results: {len(POSTS)}" in capsys.readouterr().out
    # What the platform sees, per post: the labels under the new section. A 0.45 hate score
    # no longer crosses 0.5, and harassment's 0.3 never did: the post is ok now.
    applied = _applied(engine)
    assert applied[("acme", "people like them are vermin")] == ("ok", "")
    assert applied[("globex", "I will find you and hurt you")] == ("threat", "V-1")
    assert len(applied) == len(POSTS)


def _applied(engine: Engine) -> dict[tuple[str, str], tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT a.tenant_id, p.text, a.label, a.rule_ids FROM applied_labels a "
                "JOIN posts p ON p.tenant_id = a.tenant_id AND p.post_id = a.post_id"
            )
        ).all()
    return {(t, text): (label, rules) for t, text, label, rules in rows}


def test_a_result_with_its_scores_in_the_wrong_field_is_a_dead_letter(
    engine: Engine, moderated: Any, start_sim: StartSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile = start_sim(
        api_key=API_KEY,
        moderation_scores={_sha(t): _scores(p) for t, p in PINNED.items()},
        faults=[{"kind": "unknown_label", "rate": 1.0}],
    )
    monkeypatch.setenv("BACKFILL_MODEL_BASE_URL", hostile.base_url)
    main(["run"])
    with engine.connect() as conn:
        dead = conn.execute(sa.text("SELECT outcome, reason FROM dead_letters")).all()
        results = conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one()
    assert results == 0 and len(dead) == len(POSTS)
    assert {d[0] for d in dead} == {"schema_rejected"}
    assert all("no category_scores" in d[1] for d in dead)
    # Every call was booked before its answer was read, and equals the meter.
    assert _ledger(engine)[0] == len(POSTS) and _meter(hostile)[0] == _requests(engine)


def test_a_crash_after_the_calls_resumes_without_sending_them_again(
    engine: Engine, moderated: Any, start_sim: StartSim
) -> None:
    # Calls of 50 ms and commits every 10 ms: the kill lands between two calls' bookings.
    sim = start_sim(
        api_key=API_KEY,
        latency_median_ms=50,
        moderation_scores={_sha(t): _scores(p) for t, p in PINNED.items()},
    )
    env = clean_env(
        **{
            **{k: v for k, v in os.environ.items() if k.startswith(("BACKFILL_", "DAGSTER_"))},
            "BACKFILL_CONCURRENCY": "1",
            "BACKFILL_FLUSH_MS": "10",
            "BACKFILL_MODEL_BASE_URL": sim.base_url,
        }
    )
    # The drill SIGKILLs the run right after the third usage is booked; the next run pays
    # for the rest only: a crash re-pays at most the calls in flight (announced, no outcome).
    killed = run_cli(["run", "--json"], {**env, "BACKFILL_KILL_AFTER_USAGE": "3"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    booked = _ledger(engine)[0]
    in_flight = unanswered_attempts(engine)
    lost = _settled(sim)[0] - booked
    assert 3 <= booked < len(POSTS) and 0 <= lost <= in_flight
    resumed = run_cli(["run", "--json"], env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    calls, _tokens, cost = _ledger(engine)
    billed, billed_cost = _meter(sim)
    assert cost == billed_cost == 0
    # The ledger is the meter minus the calls lost in flight, and nothing else was re-sent.
    assert billed == calls + lost and len(POSTS) <= calls <= len(POSTS) + in_flight
    assert len(_applied(engine)) == len(POSTS)


def test_a_deadline_plan_is_refused_by_name(
    moderated: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # One tier, synchronous and free: a plan would mix batch lines this dialect does not send.
    assert main(["run", "--deadline", "48h", "--dry-run"]) == 2
    assert "there is no mix of batch, flex and standard to plan" in capsys.readouterr().err


def test_batch_mode_sends_moderation_lines_and_books_them_free(
    engine: Engine, moderated: Any, start_sim: StartSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = start_sim(
        api_key=API_KEY,
        batch_processing_ms=15,
        moderation_scores={_sha(t): _scores(p) for t, p in PINNED.items()},
    )
    monkeypatch.setenv("BACKFILL_MODEL_BASE_URL", sim.base_url)
    monkeypatch.setenv("BACKFILL_DISPATCH", "batch")
    monkeypatch.setenv("BACKFILL_BATCH_POLL_SECONDS", "0.02")
    assert main(["run"]) == 0
    labels = _labels(engine)
    assert labels == {(t, text): EXPECTED[text] for t in ("acme", "globex") for text in PINNED}
    assert _applied(engine) == labels
    # One line per post on the moderations endpoint, each billed at $0 and booked alike.
    calls, tokens, cost = _ledger(engine)
    assert (calls, tokens, cost) == (len(POSTS), 0, 0)
    assert _meter(sim) == (calls, cost)
    with engine.connect() as conn:
        tiers = conn.execute(
            sa.text(
                "SELECT DISTINCT service_tier, usage_shape FROM ledger_events WHERE type = 'usage'"
            )
        ).all()
    assert [tuple(t) for t in tiers] == [("batch", "none")]


def test_policy_check_shows_the_mapping_and_refuses_a_bad_one_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "check", str(POLICY)]) == 0
    out = capsys.readouterr().out
    assert "dialect openai-moderation" in out and "harassment/threatening" in out
    bad = tmp_path / "bad.yaml"
    text = POLICY.read_text(encoding="utf-8")
    line = text.splitlines().index("      hate: {label: abuse, rule: H-2, threshold: 0.4}") + 1
    bad.write_text(text.replace("rule: H-2, threshold: 0.4", "rule: V-1, threshold: 4"))
    assert main(["policy", "check", str(bad)]) == 2
    out = capsys.readouterr().out
    assert f"{bad}:{line}:" in out
    assert "rule 'V-1' leads to 'threat', not to 'abuse'" in out
    assert "less than or equal to 1" in out
