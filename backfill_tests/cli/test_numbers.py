"""Every number a flag takes has a documented range, checked while the command line is parsed:
a huge, negative, non-finite or non-ASCII value exits 2 naming the flag, never a traceback,
and nothing is written (docs/operations.md, "Numbers on the command line")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_tests.cli_runs import cli_main
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import run

POSTS = [{"tenant_id": "acme", "post_id": f"p{i}", "text": f"post {i}"} for i in range(3)]


@pytest.fixture
def store(engine: Engine, tmp_path: Path, cli_store: dict[str, str]) -> Engine:
    import_records(engine, tmp_path, POSTS)
    return engine


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["tenant", "set-budget", "acme", "--usd", "1e400"], "argument --usd: '1e400'"),
        (["tenant", "set-budget", "acme", "--usd", "9" * 23], "argument --usd: "),
        (["tenant", "set-budget", "acme", "--usd", "NaN"], "argument --usd: 'NaN'"),
        (["tenant", "set-budget", "acme", "--tokens", "1" + "0" * 26], "argument --tokens: "),
        (["tenant", "set-budget", "acme", "--tokens", "9" * 5000], "argument --tokens: "),
        (["tenant", "set-budget", "acme", "--tokens", "\u0661\u0660"], "argument --tokens: "),
        (["rejects", "--limit", "1" + "0" * 23], "argument --limit: "),
        (["rejects", "--limit", "-1"], "argument --limit: "),
        (["check", "--tenant", "acme", "--limit", "1" + "0" * 23], "argument --limit: "),
        (["run", "--deadline", "99999999999h", "--dry-run"], "argument --deadline: "),
        (["run", "--deadline", "9" * 400 + "s", "--dry-run"], "argument --deadline: "),
        (["run", "--deadline", "10000-01-01T00:00Z", "--dry-run"], "argument --deadline: "),
        (["run", "--sample", "1" + "0" * 30], "argument --sample: "),
        (["launch", "--stale", "--dry-run", "--wait", "nan"], "argument --wait: 'nan'"),
        (["launch", "--stale", "--dry-run", "--wait", "1e400"], "argument --wait: "),
        (["demo-data", "--out", "OUT", "--posts", "-5"], "argument --posts: "),
        (["demo-data", "--out", "OUT", "--tenants", "1" + "0" * 20], "argument --tenants: "),
    ],
)
def test_a_number_out_of_range_exits_2_naming_the_flag(
    store: Engine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    says: str,
) -> None:
    out = tmp_path / "out" / "demo.jsonl"
    code, _, err = cli_main([str(out) if a == "OUT" else a for a in argv], capsys)
    assert code == 2, err[-2000:]
    assert says in err and "Traceback" not in err
    assert len(err) < 2000  # a 5,000-digit value is not echoed whole
    with store.connect() as conn:
        caps = conn.execute(sa.text("SELECT budget_tokens, budget_nanos FROM tenants")).all()
    assert [tuple(c) for c in caps] == [(None, None)]
    assert not out.parent.exists()


@pytest.mark.parametrize(
    ("argv", "doc"),
    [
        (["--usd", "1000000000"], ("1000000000.000000000", None)),
        (["--usd", "1e3", "--tokens", "1_000_000_000_000_000_000"], ("1000.000000000", 10**18)),
        (["--usd", "0", "--tokens", "0"], ("0.000000000", 0)),
    ],
)
def test_the_largest_and_smallest_budgets_are_kept_exactly(
    store: Engine,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    doc: tuple[str, int | None],
) -> None:
    code, out, err = cli_main(["tenant", "set-budget", "acme", *argv, "--json"], capsys)
    assert code == 0, err
    got = json.loads(out)
    assert (got["budget_usd"], got["budget_tokens"]) == doc


@pytest.mark.parametrize(
    ("argv", "price", "says"),
    [
        (["dry-run"], "1e999999999", "less than or equal to 1000"),
        (["usage", "--reprice"], "1e30", "less than or equal to 1000"),
        (["usage", "--reprice"], "-1", "greater than or equal to 0"),
        (["usage", "--reprice"], '"sNaN"', "finite number"),
    ],
)
def test_a_price_out_of_range_exits_2_naming_the_variable(
    store: Engine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    price: str,
    says: str,
) -> None:
    if argv[0] == "usage":
        run(store, ["acme"])  # usage events to price again (dry-run prices what is pending)
    monkeypatch.setenv(
        "BACKFILL_PRICES", f'{{"fake-moderator-1": {{"input": {price}, "output": 1}}}}'
    )
    code, _, err = cli_main(argv, capsys)
    assert code == 2, err[-2000:]
    assert "BACKFILL_PRICES=" in err and says in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("BACKFILL_FAKE_OVERBILL_FACTOR", "1e300"),  # was: an int too large for the ledger
        ("BACKFILL_TENANT_BUDGET_TOKENS", "1" + "0" * 23),
        ("BACKFILL_FAKE_LATENCY_MS", "-1"),
        ("BACKFILL_HTTP_READ_TIMEOUT_S", "inf"),
        ("BACKFILL_RETRY_MAX_SECONDS", "1e400"),
    ],
)
def test_a_variable_out_of_range_exits_2_naming_it(
    store: Engine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
    value: str,
) -> None:
    monkeypatch.setenv(name, value)
    code, _, err = cli_main(["run", "--sample", "1"], capsys)
    assert code == 2 and f"{name}=" in err and "Traceback" not in err, err[-2000:]
