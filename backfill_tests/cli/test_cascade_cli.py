"""``run`` with a cascade (``BACKFILL_CASCADE_PATH``), end to end through the CLI against the
simulator, on both stores: the free moderation endpoint screens every post, and only the posts
it is not sure of reach the chat model. A post decided at the screen is never sent to the
judge, an escalated one once; the ledger books each stage's calls and equals the simulator's
bill; a changed decide rule re-routes from stored results and pays only for the posts that now
escalate further; a SIGKILL in either stage re-pays at most the calls in flight."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.defs.asset_keys import LABELS
from backfill_assets.domain.policy.dialect_sections import MODERATION_CATEGORIES
from backfill_assets.platform_db.sink import sink_table
from backfill_assets.providersim.billing.meter import CHAT_ENDPOINT, MODERATIONS_ENDPOINT
from backfill_tests.cli_runs import clean_env, run_cli, unanswered_attempts
from backfill_tests.conftest import import_records
from backfill_tests.providers.conftest import StartSim

POLICY = Path(__file__).resolve().parents[2] / "docs" / "policies" / "forum-moderation.yaml"
API_KEY = "sk-cascade-cli-0123456789abcdef"
JUDGE = "gpt-4o-mini"
SCREEN = "omni-moderation-latest"
# Post text -> the scores the moderation endpoint answers for it (the rest near 0).
PINNED: dict[str, dict[str, float]] = {
    "I will find you and hurt you": {"violence": 0.91, "harassment/threatening": 0.62},
    "you are a worthless idiot": {"harassment": 0.83},
    "people like them are vermin": {"hate": 0.45, "harassment": 0.3},
    "some days I want to disappear": {"self-harm": 0.35, "self-harm/intent": 0.2},
    "the match was close": {},
    "nice weather today": {},
    # ok at 0.98 (one minus its highest score): decided under 0.97, passed on under 0.99.
    "see you at the meetup": {"harassment": 0.02},
}
SURE_OK = {"the match was close", "nice weather today", "see you at the meetup"}
TENANTS = ("acme", "globex")
POSTS = [
    {"tenant_id": t, "post_id": f"p{i}", "text": text}
    for t in TENANTS
    for i, text in enumerate(PINNED)
]


def _cascade(min_score: float) -> str:
    return (
        "stages:\n"
        "  - name: screen\n"
        "    dialect: openai-moderation\n"
        "    model: omni-moderation-latest\n"
        f"    decide: {{when: none_label, min_score: {min_score}}}\n"
        "  - name: judge\n"
        "    dialect: chat-json\n"
        f"    model: {JUDGE}\n"
    )


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _scores(pins: dict[str, float]) -> dict[str, float]:
    return {c: pins.get(c, 0.001) for c in MODERATION_CATEGORIES}


@pytest.fixture
def cascade(
    engine: Engine,
    tmp_path: Path,
    cli_store: dict[str, str],
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:
    import_records(engine, tmp_path, POSTS)
    sim = start_sim(
        api_key=API_KEY,
        latency_median_ms=5,
        moderation_scores={_sha(t): _scores(p) for t, p in PINNED.items()},
    )
    policy = tmp_path / "forum.yaml"
    policy.write_text(POLICY.read_text(encoding="utf-8"), encoding="utf-8")
    path = tmp_path / "cascade.yaml"
    path.write_text(_cascade(0.97), encoding="utf-8")
    for name, value in {
        "BACKFILL_MODEL_BACKEND": "openai",
        "BACKFILL_CASCADE_PATH": str(path),
        "BACKFILL_MODEL_BASE_URL": sim.base_url,
        "BACKFILL_MODEL_API_KEY": API_KEY,
        "BACKFILL_POLICY_PATH": str(policy),
    }.items():
        monkeypatch.setenv(name, value)
    return sim, path


def _meter(sim: Any, endpoint: str) -> tuple[int, int]:
    bill = sim.meter.snapshot().billed_by_endpoint.get(endpoint)
    return (0, 0) if bill is None else (bill.calls, bill.cost_nanos)


def _booked(engine: Engine) -> dict[str, tuple[int, int]]:
    """Per model: usage events and their cost."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT model, count(*), coalesce(sum(cost_nanos), 0) FROM ledger_events "
                "WHERE type = 'usage' GROUP BY model"
            )
        ).all()
    return {str(m): (int(n), int(c)) for m, n, c in rows}


def _sent_to_judge(engine: Engine) -> set[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT p.tenant_id, p.text FROM ledger_events e JOIN posts p ON "
                "p.tenant_id = e.tenant_id AND p.post_id = e.post_id "
                "WHERE e.type = 'attempt' AND e.model = :m"
            ),
            {"m": JUDGE},
        ).all()
    return {(str(t), str(x)) for t, x in rows}


def _decided(engine: Engine) -> dict[tuple[str, str], tuple[str, str]]:
    """The cascade's labels: (tenant, text) -> (stage, label)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT r.tenant_id, p.text, r.stage, r.label FROM results r JOIN posts p ON "
                "p.tenant_id = r.tenant_id AND p.post_id = r.post_id WHERE r.model = 'cascade'"
            )
        ).all()
    return {(str(t), str(x)): (str(s), str(label)) for t, x, s, label in rows}


def _applied(engine: Engine) -> dict[tuple[str, str], str]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT a.tenant_id, p.text, a.label FROM applied_labels a "
                "JOIN posts p ON p.tenant_id = a.tenant_id AND p.post_id = a.post_id"
            )
        ).all()
    return {(str(t), str(x)): str(label) for t, x, label in rows}


def _judge_labels(engine: Engine) -> dict[tuple[str, str], str]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT r.tenant_id, p.text, r.label FROM results r JOIN posts p ON "
                "p.tenant_id = r.tenant_id AND p.post_id = r.post_id WHERE r.model = :m"
            ),
            {"m": JUDGE},
        ).all()
    return {(str(t), str(x)): str(label) for t, x, label in rows}


def test_the_screen_decides_the_sure_posts_and_only_the_rest_reach_the_judge(
    engine: Engine, cascade: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    sim, path = cascade
    assert main(["run"]) == 0
    out = capsys.readouterr().out
    hard = {(t, x) for t in TENANTS for x in PINNED if x not in SURE_OK}
    # Every post was screened once; the judge was sent exactly the posts the screen was not
    # sure of, each once.
    assert _sent_to_judge(engine) == hard
    booked = _booked(engine)
    assert booked["omni-moderation-latest"][0] == len(POSTS)
    assert booked[JUDGE][0] == len(hard)
    # The ledger is the simulator's bill, stage by stage.
    assert _meter(sim, CHAT_ENDPOINT) == (len(hard), booked[JUDGE][1])
    assert _meter(sim, MODERATIONS_ENDPOINT)[1] == booked["omni-moderation-latest"][1] == 0
    # Each post's label says which stage decided it, and the applied label is that one.
    decided = _decided(engine)
    assert {k for k, (stage, _l) in decided.items() if stage == "screen"} == {
        (t, x) for t in TENANTS for x in SURE_OK
    }
    assert all(decided[k] == ("screen", "ok") for k in decided if k[1] in SURE_OK)
    judged = _judge_labels(engine)
    assert all(decided[k] == ("judge", judged[k]) for k in hard)
    assert _applied(engine) == {k: label for k, (_s, label) in decided.items()}
    assert "stage screen: sent 14, calls" in out and "stage judge: sent 8" in out
    # The export says which stage decided each of the cascade's labels.
    assert main(["export", "--format", "jsonl", "--out", str(path.parent / "out")]) == 0
    rows = [
        json.loads(line)
        for t in TENANTS
        for line in (path.parent / "out" / f"{t}.jsonl").read_text("utf-8").splitlines()
    ]
    stages = {r["stage"] for r in rows if r["model"] == "cascade"}
    assert stages == {"screen", "judge"}
    assert {r["stage"] for r in rows if r["model"] != "cascade"} == {None}
    # A rerun has nothing to do at any stage; forced, it sends nothing either, and each
    # partition's metadata says which stage decided how many of its labels.
    before = (_meter(sim, CHAT_ENDPOINT), _meter(sim, MODERATIONS_ENDPOINT))
    assert main(["run"]) == 0
    capsys.readouterr()
    assert main(["run", "--force", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (_meter(sim, CHAT_ENDPOINT), _meter(sim, MODERATIONS_ENDPOINT)) == before
    assert _booked(engine) == booked
    per_stage = {"screen": 0, "judge": 0}
    for row in doc["partitions"]:
        assert [s["stage"] for s in row["stages"]] == ["screen", "judge"]
        for figures in row["stages"]:
            per_stage[figures["stage"]] += figures.get("decided", 0)
    assert per_stage == {"screen": len(SURE_OK) * len(TENANTS), "judge": len(hard)}
    assert [(s["stage"], s["calls"]) for s in doc["stages"]] == [("screen", 0), ("judge", 0)]
    # The labels' metadata in the UI shows the share of a partition's labels each stage
    # decided (a partition with labels of both stages).
    [pk] = [
        row["partition"]
        for row in doc["partitions"]
        if all(f.get("decided", 0) for f in row["stages"])
    ][:1]
    with dg.DagsterInstance.from_config(os.environ["DAGSTER_HOME"]) as inst:
        [record] = inst.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=LABELS, asset_partitions=[pk]), limit=1
        ).records
        event = record.event_log_entry.asset_materialization
        assert event is not None
    table, figures = event.metadata["stage_distribution"].value, event.metadata["stages"].value
    assert isinstance(table, str) and isinstance(figures, list)
    assert [f["stage"] for f in figures] == ["screen", "judge"]
    total = sum(f["decided"] for f in figures)
    for f in figures:
        assert f"| {f['decided']} | {f['decided'] / total:.1%} |" in table, (f, table)


def test_a_changed_threshold_reroutes_and_pays_only_for_the_posts_passed_on(
    engine: Engine,
    cascade: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim, path = cascade
    # The platform's own table, which the apply writes back into.
    sink = f"sqlite:///{path.parent / 'platform.db'}"
    platform = sa.create_engine(sink)
    with platform.begin() as conn:
        conn.exec_driver_sql(str(sa.schema.CreateTable(sink_table()).compile(platform)))
    monkeypatch.setenv("BACKFILL_SINK_URL", sink)
    assert main(["run"]) == 0
    booked = _booked(engine)
    screened = _meter(sim, MODERATIONS_ENDPOINT)
    judged = _meter(sim, CHAT_ENDPOINT)
    capsys.readouterr()
    # Stricter: the post at 0.98 is no longer sure, in either tenant, and goes to the judge.
    path.write_text(_cascade(0.99), encoding="utf-8")
    assert main(["run"]) == 0
    out = capsys.readouterr().out
    assert _meter(sim, MODERATIONS_ENDPOINT) == screened
    # It costs exactly the newly escalated posts' judge calls: in the simulator's bill, and
    # booked to the nano-dollar.
    now = _booked(engine)
    calls, cost = _meter(sim, CHAT_ENDPOINT)
    assert calls == judged[0] + len(TENANTS)
    assert now[JUDGE][0] == booked[JUDGE][0] + len(TENANTS)
    assert now[JUDGE][1] - booked[JUDGE][1] == cost - judged[1] > 0
    decided = _decided(engine)
    assert all(decided[(t, "see you at the meetup")][0] == "judge" for t in TENANTS)
    assert "re-routed from stored results: 2 (no call made)" in out
    # Back to 0.97: every answer needed is stored, so nothing is sent at all.
    judged = _meter(sim, CHAT_ENDPOINT)
    path.write_text(_cascade(0.97), encoding="utf-8")
    assert main(["run"]) == 0
    assert _meter(sim, CHAT_ENDPOINT) == judged
    assert _meter(sim, MODERATIONS_ENDPOINT) == screened
    assert all(_decided(engine)[(t, "see you at the meetup")] == ("screen", "ok") for t in TENANTS)
    assert all(_applied(engine)[(t, "see you at the meetup")] == "ok" for t in TENANTS)
    # The sink follows every re-route: each post's row names the stage that decided it now.
    with platform.connect() as conn:
        written = {
            (str(t), str(p)): str(st)
            for t, p, st in conn.execute(
                sa.text("SELECT tenant_id, post_id, stage FROM moderation_labels")
            )
        }
    platform.dispose()
    decided = _decided(engine)
    assert len(written) == len(POSTS)
    assert sorted(written.values()) == sorted(stage for stage, _label in decided.values())


@pytest.mark.parametrize(
    ("stage", "kill_after"),
    # The drill counts usages over the stages: half-way through the screen's 14, or right
    # after the judge's second.
    [("screen", len(POSTS) // 2), ("judge", len(POSTS) + 2)],
)
def test_a_crash_in_either_stage_repays_at_most_the_calls_in_flight(
    engine: Engine, cascade: Any, start_sim: StartSim, stage: str, kill_after: int
) -> None:
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
    killed = run_cli(["run", "--json"], {**env, "BACKFILL_KILL_AFTER_USAGE": str(kill_after)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    at_kill = _booked(engine)
    if stage == "screen":
        # Killed inside the first stage: nothing had reached the judge yet.
        assert 0 < at_kill[SCREEN][0] < len(POSTS) and JUDGE not in at_kill
    else:
        assert at_kill[SCREEN][0] == len(POSTS) and at_kill[JUDGE][0] == 2
    resumed = run_cli(["run", "--json"], env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _settle(sim)
    booked = _booked(engine)
    hard = {(t, x) for t in TENANTS for x in PINNED if x not in SURE_OK}
    in_flight = unanswered_attempts(engine)
    # Per stage, what the simulator billed beyond the ledger is what was in flight at the
    # kill (attempts with no outcome), and no post went to the judge that the screen decided.
    for model, endpoint, reach in (
        (SCREEN, MODERATIONS_ENDPOINT, len(POSTS)),
        (JUDGE, CHAT_ENDPOINT, len(hard)),
    ):
        calls, _cost = _meter(sim, endpoint)
        assert reach <= booked[model][0] <= calls <= booked[model][0] + in_flight, model
    assert _sent_to_judge(engine) == hard
    assert len(_applied(engine)) == len(POSTS)


def _settle(sim: Any) -> None:
    """Wait for calls the killed run left in flight to reach the simulator's meter."""
    seen = (_meter(sim, CHAT_ENDPOINT), _meter(sim, MODERATIONS_ENDPOINT))
    while True:
        time.sleep(0.3)
        now = (_meter(sim, CHAT_ENDPOINT), _meter(sim, MODERATIONS_ENDPOINT))
        if now == seen:
            return
        seen = now


def test_batch_mode_runs_each_stages_batch_and_the_next_only_over_what_it_passed_on(
    engine: Engine, cascade: Any, start_sim: StartSim, monkeypatch: pytest.MonkeyPatch
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
    hard = {(t, x) for t in TENANTS for x in PINNED if x not in SURE_OK}
    # The screen's batch had every post; the judge's only the posts the screen passed on.
    assert _sent_to_judge(engine) == hard
    booked = _booked(engine)
    assert booked["omni-moderation-latest"][0] == len(POSTS)
    assert booked[JUDGE][0] == len(hard)
    assert _meter(sim, CHAT_ENDPOINT) == (len(hard), booked[JUDGE][1])
    with engine.connect() as conn:
        tiers = conn.execute(
            sa.text("SELECT DISTINCT service_tier FROM ledger_events WHERE type = 'usage'")
        ).all()
    assert [t[0] for t in tiers] == ["batch"]
    assert len(_decided(engine)) == len(POSTS)
    before = _booked(engine)
    assert main(["run"]) == 0
    assert _booked(engine) == before


def test_what_a_cascade_cannot_do_is_refused_by_name(
    cascade: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _sim, path = cascade
    guarded = tmp_path / "guarded.yaml"
    guarded.write_text(
        path.read_text(encoding="utf-8").replace(
            "dialect: chat-json\n    model: gpt-4o-mini",
            "dialect: safeguard\n    model: gpt-oss-safeguard-20b",
        ),
        encoding="utf-8",
    )
    monkeypatch.setenv("BACKFILL_CASCADE_PATH", str(guarded))
    monkeypatch.setenv("BACKFILL_DISPATCH", "batch")
    assert main(["run"]) == 2
    assert "stage judge (safeguard) is served by vLLM" in capsys.readouterr().err
    monkeypatch.setenv("BACKFILL_CASCADE_PATH", str(path))
    monkeypatch.delenv("BACKFILL_DISPATCH")
    assert main(["run", "--sample", "3"]) == 2
    assert "not with BACKFILL_CASCADE_PATH" in capsys.readouterr().err
    # The deadline planner refuses a cascade rather than plan it: it prices one model's calls.
    for argv in (["--deadline", "3d"], ["--deadline", "3d", "--dry-run"]):
        assert main(["run", *argv]) == 2
        assert "--deadline and --sample plan one model's calls" in capsys.readouterr().err
    monkeypatch.setenv("BACKFILL_MODEL_BACKEND", "fake")
    assert main(["run"]) == 2
    assert "BACKFILL_CASCADE_PATH needs BACKFILL_MODEL_BACKEND=openai" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["sync", "batch"])
def test_a_budget_reserves_the_stages_ahead_before_the_screen_is_sent(
    engine: Engine, cascade: Any, start_sim: StartSim, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    sim, _path = cascade
    if mode == "batch":
        # A batch chunk holds, in its reservation, what its lines' later stages may cost.
        sim = start_sim(
            api_key=API_KEY,
            batch_processing_ms=15,
            moderation_scores={_sha(t): _scores(p) for t, p in PINNED.items()},
        )
        monkeypatch.setenv("BACKFILL_MODEL_BASE_URL", sim.base_url)
        monkeypatch.setenv("BACKFILL_DISPATCH", "batch")
        monkeypatch.setenv("BACKFILL_BATCH_POLL_SECONDS", "0.02")
    # Enough for any screen call (the endpoint is free, its bound is the text) but not for the
    # judge's prompt after it: nothing is screened, since the post could not be judged.
    monkeypatch.setenv("BACKFILL_TENANT_BUDGET_TOKENS", "600")
    main(["run"])
    assert _meter(sim, MODERATIONS_ENDPOINT) == (0, 0) and _meter(sim, CHAT_ENDPOINT) == (0, 0)
    assert _booked(engine) == {} and _decided(engine) == {}
    # With room for the whole way, every post goes through, as without a budget.
    monkeypatch.setenv("BACKFILL_TENANT_BUDGET_TOKENS", "1000000")
    assert main(["run"]) == 0
    assert len(_decided(engine)) == len(POSTS)
    assert _booked(engine)[JUDGE][0] == len(POSTS) - len(SURE_OK) * len(TENANTS)
