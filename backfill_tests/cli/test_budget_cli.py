"""``tenant set-budget``: dollar and token caps per tenant, refused with a reason when
malformed, shown by ``tenant list`` and ``dry-run`` beside what is billed, reserved and free;
and a tenant's cap binds the next ``run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.domain.money.nanos import nanos_of_usd
from backfill_tests.conftest import import_records
from backfill_tests.providers.conftest import StartSim

POSTS = [
    {"tenant_id": t, "post_id": f"p{i}", "text": f"{t} post {i}"}
    for t in ("acme", "globex")
    for i in range(30)
]


@pytest.fixture
def store(engine: Engine, tmp_path: Path, cli_store: dict[str, str]) -> Engine:
    import_records(engine, tmp_path, POSTS)
    return engine


def _json(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 0) -> object:
    assert main(argv) == code
    out = capsys.readouterr()
    return json.loads(out.out) if code == 0 else out.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["acme", "--usd", "-5"],
            "argument --usd: '-5': a budget is a finite amount of at least 0",
        ),
        (["acme", "--usd", "5.0000000001"], "finer than a nano-dollar"),
        (["acme", "--usd", "lots"], "'lots' is not a dollar amount"),
        (["acme", "--tokens", "1.5"], "argument --tokens: '1.5' is not a whole number"),
        (["acme", "--tokens", "-1"], "'-1' is out of range: 0 to 10^18"),
        (["nobody", "--usd", "5"], "argument TENANT: unknown tenant 'nobody'"),
        (["acme"], "give --usd AMOUNT and/or --tokens N"),
    ],
)
def test_a_bad_budget_exits_2_naming_what_is_wrong(
    store: Engine, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    err = _json(capsys, ["tenant", "set-budget", *argv], code=2)
    assert message in str(err)
    with store.connect() as conn:
        caps = conn.execute(sa.text("SELECT budget_tokens, budget_nanos FROM tenants")).all()
    assert {tuple(c) for c in caps} == {(None, None)}


def test_caps_are_set_kept_per_unit_removed_and_shown(
    store: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _json(capsys, ["tenant", "set-budget", "acme", "--usd", "50", "--json"])
    assert doc == {
        "tenant": "acme",
        "budget_usd": "50.000000000",
        "budget_tokens": None,
        "billed_usd": "0.000000000",
        "billed_tokens": 0,
        "reserved_usd": "0.000000000",
        "reserved_tokens": 0,
        "free_usd": "50.000000000",
        "free_tokens": None,
    }
    # Setting tokens keeps the dollar cap; 'none' removes one unit only.
    doc = _json(capsys, ["tenant", "set-budget", "acme", "--tokens", "5_000", "--json"])
    assert isinstance(doc, dict) and (doc["budget_usd"], doc["budget_tokens"]) == (
        "50.000000000",
        5000,
    )
    doc = _json(capsys, ["tenant", "set-budget", "acme", "--usd", "none", "--json"])
    assert isinstance(doc, dict) and (doc["budget_usd"], doc["budget_tokens"]) == (None, 5000)
    _json(capsys, ["tenant", "set-budget", "acme", "--usd", "$12.5", "--json"])
    listed = _json(capsys, ["tenant", "list", "--json"])
    assert isinstance(listed, dict)
    acme = next(r for r in listed["tenants"] if r["tenant"] == "acme")
    assert (acme["budget_usd"], acme["budget_tokens"]) == ("12.500000000", 5000)
    assert main(["tenant", "set-budget", "acme", "--usd", "1"]) == 0
    text = capsys.readouterr().out
    assert "acme: $1.000000000 cap, $1.000000000 free; 5000 token cap, 5000 free" in text


def test_a_cap_binds_the_next_run_and_dry_run_shows_it_in_dollars(
    store: Engine,
    capsys: pytest.CaptureFixture[str],
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = start_sim(prompt_token_factor=3.0)
    monkeypatch.setenv("BACKFILL_MODEL_BACKEND", "openai")
    monkeypatch.setenv("BACKFILL_MODEL", "gpt-4o-mini")
    monkeypatch.setenv("BACKFILL_MODEL_BASE_URL", sim.base_url)
    monkeypatch.setenv("BACKFILL_API_KEY", "sk-test-budget-cli-0123456789")
    _json(capsys, ["tenant", "set-budget", "acme", "--usd", "0.0008", "--json"])
    plan = _json(capsys, ["dry-run", "--json"])
    assert isinstance(plan, dict)
    rows = {r["tenant"]: r for r in plan["tenants"]}
    assert rows["acme"]["budget_usd"] == rows["acme"]["free_usd"] == "0.000800000"
    assert rows["globex"]["budget_usd"] is None
    # The whole of acme's pending work would need more than its cap reserved.
    assert float(rows["acme"]["bound_cost_usd"]) > 0.0008
    # acme's deferred keys leave its partitions uncovered: the blocking check keeps them from
    # being applied, and the run says why.
    assert main(["run"]) == 1
    out = capsys.readouterr()
    assert (
        "acme: keys deferred to a later run: its budget is spent or reserved" in out.out + out.err
    )
    after = _json(capsys, ["tenant", "set-budget", "acme", "--usd", "0.0008", "--json"])
    assert isinstance(after, dict)
    billed = nanos_of_usd(str(after["billed_usd"]))
    assert 0 < billed <= 800_000
    assert after["reserved_usd"] == "0.000000000"
    with store.connect() as conn:
        done = dict(
            conn.execute(
                sa.text("SELECT tenant_id, count(*) FROM results GROUP BY tenant_id")
            ).all()
        )
    assert done["globex"] == 30 and 0 < done["acme"] < 30
