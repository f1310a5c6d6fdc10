"""``run`` in the ``llama-guard`` and ``safeguard`` dialects, end to end through the CLI against
the simulator's vLLM wire, on both stores: labels as the policy maps the answers, the label's
probability stored, the ledger equal to the simulator's meter, a rerun that sends nothing, a
crash that re-pays at most what was in flight, budgets that reserve the output bound, and each
fault of a real server handled as documented (accepted, or a dead letter that says why)."""

from __future__ import annotations

import hashlib
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.providersim.billing.meter import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT
from backfill_tests.cli_runs import clean_env, run_cli, unanswered_attempts
from backfill_tests.conftest import import_records
from backfill_tests.providers.conftest import StartSim

POLICY = Path(__file__).resolve().parents[2] / "docs" / "policies" / "forum-moderation.yaml"
API_KEY = "sk-guard-cli-0123456789abcdef"
GUARD = "llama-guard-3-8b"
SAFEGUARD = "gpt-oss-safeguard-20b"
# The simulator's list prices for them (USD per million tokens), booked alike.
PRICES = (
    '{"llama-guard-3-8b": {"input": 0.20, "output": 0.20}, '
    '"gpt-oss-safeguard-20b": {"input": 0.075, "output": 0.30}}'
)
# The forum policy's rules in file order are Llama Guard's categories S1..S4:
# V-1 (threat), H-1 (abuse), H-2 (abuse), S-1 (self_harm).
PINNED = {
    "I will kill you": "unsafe\nS1",
    "you are a worthless idiot": "unsafe\nS2",
    "people who hate them are vermin, idiots": "unsafe\nS3,S2",
    "some days I think of suicide": "unsafe\nS4,S1",
    "the match was close": "safe",
}
EXPECTED = {
    "I will kill you": ("threat", "V-1"),
    "you are a worthless idiot": ("abuse", "H-1"),
    "people who hate them are vermin, idiots": ("abuse", "H-1,H-2"),
    "some days I think of suicide": ("self_harm", "S-1"),
    "the match was close": ("ok", ""),
}
TENANTS = ("acme", "globex")
POSTS = [
    {"tenant_id": t, "post_id": f"p{i}", "text": text}
    for t in TENANTS
    for i, text in enumerate(PINNED)
]
# With the built-in categories mapped: Violent Crimes, Hate, Suicide & Self-Harm.
SECTION = "  llama-guard:\n    categories:\n      S1: V-1\n      S10: H-2\n      S11: S-1\n"
BUILTIN_PINNED = {
    "I will kill you": "unsafe\nS1",
    "you are a worthless idiot": "unsafe\nS5",  # Defamation: the policy does not read it
    "people who hate them are vermin, idiots": "unsafe\nS10",
    "some days I think of suicide": "unsafe\nS11,S1",
    "the match was close": "safe",
}
BUILTIN_EXPECTED = {
    "I will kill you": ("threat", "V-1"),
    "you are a worthless idiot": ("ok", ""),
    "people who hate them are vermin, idiots": ("abuse", "H-2"),
    "some days I think of suicide": ("self_harm", "S-1"),
    "the match was close": ("ok", ""),
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _use(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def guarded(
    engine: Engine,
    tmp_path: Path,
    cli_store: dict[str, str],
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:
    """Posts imported, a simulator answering the pinned assessments, the dialect set."""
    import_records(engine, tmp_path, POSTS)
    sim = start_sim(
        api_key=API_KEY, strict_models=True, guard_answers={_sha(t): a for t, a in PINNED.items()}
    )
    policy = tmp_path / "forum.yaml"
    # The moderation endpoint's section stays; no llama-guard section: the rules are S1..S4.
    policy.write_text(POLICY.read_text(encoding="utf-8"), encoding="utf-8")
    _use(
        monkeypatch,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_DIALECT="llama-guard",
        BACKFILL_MODEL=GUARD,
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_MODEL_API_KEY=API_KEY,
        BACKFILL_POLICY_PATH=str(policy),
        BACKFILL_PRICES=PRICES,
    )
    return sim, policy


def _rows(engine: Engine, table: str = "results") -> dict[tuple[str, str], tuple[Any, ...]]:
    extra = ", r.p_label, r.confidence" if table == "results" else ""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                f"SELECT r.tenant_id, p.text, r.label, r.rule_ids{extra} FROM {table} r "
                "JOIN posts p ON p.tenant_id = r.tenant_id AND p.post_id = r.post_id"
            )
        ).all()
    return {(r[0], r[1]): tuple(r[2:]) for r in rows}


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


def _meter(sim: Any, endpoint: str) -> tuple[int, int, int]:
    """Calls, tokens and cost the simulator billed on ``endpoint``."""
    calls = [c for c in sim.meter.snapshot().billed.values() if c.endpoint == endpoint]
    tokens = sum(c.prompt_tokens + c.completion_tokens for c in calls)
    return len(calls), tokens, sum(c.cost_nanos for c in calls)


def _dead(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text("SELECT outcome, reason FROM dead_letters"))]


def test_the_policys_rules_as_categories_label_every_post_and_the_ledger_equals_the_meter(
    engine: Engine, guarded: Any
) -> None:
    sim, _policy = guarded
    assert main(["run"]) == 0
    got = _rows(engine)
    assert {k: v[:2] for k, v in got.items()} == {
        (t, text): EXPECTED[text] for t in TENANTS for text in PINNED
    }
    assert {k: v[:2] for k, v in _rows(engine, "applied_labels").items()} == {
        k: v[:2] for k, v in got.items()
    }
    # The label's probability is the assessment token's, as the simulator drew it (0.55 to
    # 0.999), and the confidence is the same number.
    for _label, _rules, p_label, confidence in got.values():
        assert p_label is not None and 0.55 <= p_label <= 0.999
        assert confidence == pytest.approx(p_label)
    calls, tokens, cost = _ledger(engine)
    assert (calls, tokens, cost) == _meter(sim, COMPLETIONS_ENDPOINT)
    assert calls == len(POSTS) and cost > 0 and _meter(sim, CHAT_ENDPOINT)[0] == 0
    # A rerun has nothing to do and sends nothing.
    assert main(["run"]) == 0
    assert _meter(sim, COMPLETIONS_ENDPOINT)[0] == len(POSTS)


def test_the_built_in_categories_go_through_the_chat_template_as_the_section_maps_them(
    engine: Engine,
    guarded: Any,
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _sim, policy = guarded
    sim = start_sim(api_key=API_KEY, guard_answers={_sha(t): a for t, a in BUILTIN_PINNED.items()})
    policy.write_text(policy.read_text(encoding="utf-8") + SECTION, encoding="utf-8")
    _use(monkeypatch, BACKFILL_MODEL_BASE_URL=sim.base_url)
    assert main(["run"]) == 0
    got = _rows(engine)
    assert {k: v[:2] for k, v in got.items()} == {
        (t, text): BUILTIN_EXPECTED[text] for t in TENANTS for text in BUILTIN_PINNED
    }
    # "unsafe" in a category the policy does not read: ok, and no probability says so.
    assert all(v[2] is None for (_t, text), v in got.items() if text.startswith("you are"))
    assert _ledger(engine) == _meter(sim, CHAT_ENDPOINT)
    assert _meter(sim, COMPLETIONS_ENDPOINT)[0] == 0
    # Hate now stands for the insult rule, and Defamation is read too: the section is not
    # sent, so the stored answers are read again under it, and not one call is made.
    sent = _meter(sim, CHAT_ENDPOINT)
    text = policy.read_text(encoding="utf-8")
    policy.write_text(text.replace("S10: H-2", "S10: H-1\n      S5: H-1"), encoding="utf-8")
    assert main(["run"]) == 0
    assert _meter(sim, CHAT_ENDPOINT) == sent and _ledger(engine) == sent
    again = _rows(engine)
    assert {k: v[:2] for k, v in _rows(engine, "applied_labels").items()} == {
        k: v[:2] for k, v in again.items()
    }
    for tenant in TENANTS:
        assert again[(tenant, "people who hate them are vermin, idiots")][:2] == ("abuse", "H-1")
        assert again[(tenant, "you are a worthless idiot")][:2] == ("abuse", "H-1")
        assert again[(tenant, "I will kill you")][:2] == ("threat", "V-1")
    assert f"relabelled from stored results: {len(POSTS)}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("switch", "accepted", "why"),
    [
        ("guard_whitespace", True, ""),
        ("guard_case", False, "neither 'safe' nor 'unsafe'"),
        ("guard_third_line", False, "neither 'safe' nor 'unsafe'"),
        ("guard_unknown_code", False, "unknown category S"),
    ],
)
def test_a_real_servers_quirks_are_read_as_the_reference_parser_reads_them(
    engine: Engine,
    guarded: Any,
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
    switch: str,
    accepted: bool,
    why: str,
) -> None:
    _sim, policy = guarded
    # Unpinned: the simulator's phrases decide (kill: S1, hate: S10, suicide: S11), and the
    # quirk distorts each answer as a real server might.
    sim = start_sim(api_key=API_KEY, **{switch: True})
    policy.write_text(policy.read_text(encoding="utf-8") + SECTION, encoding="utf-8")
    _use(monkeypatch, BACKFILL_MODEL_BASE_URL=sim.base_url)
    main(["run"])
    dead = _dead(engine)
    results = _rows(engine)
    assert len(results) + len(dead) == len(POSTS)
    if accepted:
        assert not dead
    else:
        assert dead and {d[0] for d in dead} == {"schema_rejected"}
        assert all(why in d[1] for d in dead)
    # Whatever was read, every call was booked first, exactly as billed.
    assert _ledger(engine) == _meter(sim, CHAT_ENDPOINT)


def _settled(sim: Any, endpoint: str) -> tuple[int, int, int]:
    """The meter once a killed client's last request has been answered."""
    seen = _meter(sim, endpoint)
    while True:
        time.sleep(0.3)
        now = _meter(sim, endpoint)
        if now == seen:
            return now
        seen = now


@pytest.mark.parametrize(
    ("dialect", "model", "endpoint"),
    [("llama-guard", GUARD, COMPLETIONS_ENDPOINT), ("safeguard", SAFEGUARD, CHAT_ENDPOINT)],
)
def test_a_crash_resumes_and_re_pays_at_most_what_was_in_flight(
    engine: Engine, guarded: Any, start_sim: StartSim, dialect: str, model: str, endpoint: str
) -> None:
    sim = start_sim(
        api_key=API_KEY,
        latency_median_ms=50,
        guard_answers={_sha(t): a for t, a in PINNED.items()},
    )
    env = clean_env(
        **{
            **{k: v for k, v in os.environ.items() if k.startswith(("BACKFILL_", "DAGSTER_"))},
            "BACKFILL_CONCURRENCY": "1",
            "BACKFILL_FLUSH_MS": "10",
            "BACKFILL_MODEL_BASE_URL": sim.base_url,
            "BACKFILL_MODEL_DIALECT": dialect,
            "BACKFILL_MODEL": model,
            "BACKFILL_REASONING_EFFORT": "low",
        }
    )
    killed = run_cli(["run", "--json"], {**env, "BACKFILL_KILL_AFTER_USAGE": "3"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    booked = _ledger(engine)[0]
    lost = _settled(sim, endpoint)[0] - booked
    # What the provider billed and the ledger lacks is at most what was announced and not
    # booked: the call in flight, and calls answered but not yet durable (the kill lands on a
    # group commit, which a loaded machine delays).
    in_flight = unanswered_attempts(engine)
    assert 3 <= booked < len(POSTS) and 0 <= lost <= in_flight
    resumed = run_cli(["run", "--json"], env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    calls, tokens, cost = _ledger(engine)
    billed, billed_tokens, billed_cost = _meter(sim, endpoint)
    assert billed == calls + lost and len(POSTS) <= calls <= len(POSTS) + in_flight
    if lost == 0:
        assert (tokens, cost) == (billed_tokens, billed_cost)
    assert len(_rows(engine, "applied_labels")) == len(POSTS)


def test_a_token_budget_stops_a_tenant_at_its_cap(
    engine: Engine, guarded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim, _policy = guarded
    # A call reserves its bound (~1,100 tokens: the prompt's bytes and the output cap) and
    # settles to what was billed (~190): a 1,500-token cap admits three calls per tenant.
    _use(monkeypatch, BACKFILL_TENANT_BUDGET_TOKENS="1500", BACKFILL_CONCURRENCY="1")
    main(["run"])
    with engine.connect() as conn:
        per = dict(
            conn.execute(
                sa.text(
                    "SELECT tenant_id, sum(tokens_in + tokens_out) FROM ledger_events "
                    "WHERE type = 'usage' GROUP BY tenant_id"
                )
            ).all()
        )
    assert per and all(int(v) <= 1500 for v in per.values())
    assert 0 < len(_rows(engine)) < len(POSTS)
    assert _ledger(engine) == _meter(sim, COMPLETIONS_ENDPOINT)


@pytest.fixture
def safeguarded(
    engine: Engine,
    tmp_path: Path,
    cli_store: dict[str, str],
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    import_records(engine, tmp_path, POSTS)
    policy = tmp_path / "forum.yaml"
    policy.write_text(POLICY.read_text(encoding="utf-8"), encoding="utf-8")
    _use(
        monkeypatch,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_DIALECT="safeguard",
        BACKFILL_MODEL=SAFEGUARD,
        BACKFILL_MODEL_API_KEY=API_KEY,
        BACKFILL_POLICY_PATH=str(policy),
        BACKFILL_PRICES=PRICES,
    )
    return policy


def _answers_from(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT message, count(*) FROM ledger_events WHERE type = 'usage' GROUP BY message"
            )
        ).all()
    return {str(m): int(n) for m, n in rows}


@pytest.mark.parametrize(
    ("switch", "where", "accepted"),
    [
        (None, "content", True),
        ("safeguard_unenforced", "content", True),
        ("safeguard_content_null", "reasoning_content", True),
        ("safeguard_answer_in_reasoning", "reasoning_json", True),
        ("safeguard_prose_only", "none", False),
    ],
)
def test_safeguards_answer_is_taken_where_the_server_put_it_never_from_prose(
    engine: Engine,
    safeguarded: Path,
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
    switch: str | None,
    where: str,
    accepted: bool,
) -> None:
    sim = start_sim(api_key=API_KEY, **({switch: True} if switch else {}))
    _use(monkeypatch, BACKFILL_MODEL_BASE_URL=sim.base_url, BACKFILL_REASONING_EFFORT="low")
    main(["run"])
    assert _answers_from(engine) == {f"answer_from: {where}": len(POSTS)}
    if accepted:
        assert len(_rows(engine)) == len(POSTS) and not _dead(engine)
    else:
        dead = _dead(engine)
        assert len(dead) == len(POSTS) and {d[0] for d in dead} == {"schema_rejected"}
    calls, tokens, cost = _ledger(engine)
    assert (calls, tokens, cost) == _meter(sim, CHAT_ENDPOINT)
    # Reasoning is paid for: booked within the completion tokens, and counted apart.
    with engine.connect() as conn:
        reasoning = conn.execute(
            sa.text("SELECT sum(tokens_reasoning) FROM ledger_events WHERE type = 'usage'")
        ).scalar_one()
    # (The simulator reasons 60 to 150 tokens at low effort; with the answer moved into the
    # reasoning field, the reasoning is that answer.)
    assert int(reasoning) >= (60 * len(POSTS) if where == "content" else len(POSTS))


def test_safeguards_output_bound_is_reserved_so_a_budget_defers_rather_than_cuts(
    engine: Engine, safeguarded: Path, start_sim: StartSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = start_sim(api_key=API_KEY)
    # 8,192 output tokens are reserved per call: a 5,000-token cap lets none start.
    _use(monkeypatch, BACKFILL_MODEL_BASE_URL=sim.base_url, BACKFILL_TENANT_BUDGET_TOKENS="5000")
    main(["run"])
    assert _meter(sim, CHAT_ENDPOINT)[0] == 0 and not _rows(engine)
    # A bound too small for the reasoning is cut by the server: booked, then no answer.
    _use(
        monkeypatch,
        BACKFILL_TENANT_BUDGET_TOKENS="",
        BACKFILL_SAFEGUARD_MAX_OUTPUT_TOKENS="256",
        BACKFILL_REASONING_EFFORT="high",
    )
    main(["run"])
    assert _ledger(engine) == _meter(sim, CHAT_ENDPOINT)
    dead = _dead(engine)
    assert len(dead) == len(POSTS) and {d[0] for d in dead} == {"schema_rejected"}


def test_a_chat_models_label_probability_is_read_from_its_logprobs(
    engine: Engine,
    tmp_path: Path,
    cli_store: dict[str, str],
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from backfill_assets.providersim.answers import label_probability_of

    import_records(engine, tmp_path, POSTS)
    sim = start_sim(api_key=API_KEY)
    _use(
        monkeypatch,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL="gpt-4o-mini",
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_MODEL_API_KEY=API_KEY,
    )
    assert main(["run"]) == 0
    with engine.connect() as conn:
        got = dict(conn.execute(sa.text("SELECT key, p_label FROM results")).all())
    assert len(got) == len(POSTS)
    for key, p_label in got.items():
        assert p_label == pytest.approx(label_probability_of(key))
    # Off: nothing is asked, and nothing invented.
    _use(monkeypatch, BACKFILL_LOGPROBS="0")
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM applied_labels"))
        conn.execute(sa.text("DELETE FROM results"))
    assert main(["run"]) == 0
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(p_label) FROM results")).scalar_one() == 0
    assert not math.isnan(sum(got.values()))


def test_batch_lines_ask_for_logprobs_and_keep_the_labels_probability(
    engine: Engine,
    tmp_path: Path,
    cli_store: dict[str, str],
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from backfill_assets.providersim.answers import label_probability_of

    import_records(engine, tmp_path, POSTS)
    sim = start_sim(api_key=API_KEY, batch_processing_ms=15)
    _use(
        monkeypatch,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL="gpt-4o-mini",
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_MODEL_API_KEY=API_KEY,
        BACKFILL_DISPATCH="batch",
        BACKFILL_BATCH_POLL_SECONDS="0.02",
    )
    assert main(["run"]) == 0
    with engine.connect() as conn:
        got = dict(conn.execute(sa.text("SELECT key, p_label FROM results")).all())
    assert len(got) == len(POSTS)
    assert all(p == pytest.approx(label_probability_of(k)) for k, p in got.items())
