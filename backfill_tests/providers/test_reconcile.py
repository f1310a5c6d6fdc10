"""``usage --reconcile``: the ledger against the provider's own usage and costs reports, in
OpenAI's organization usage format as the simulator serves it for its own traffic."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.domain.money.prices import Tier
from backfill_assets.domain.money.reconcile import ReportError, read_report
from backfill_assets.providersim import Simulator
from backfill_tests.conftest import import_records
from backfill_tests.providers.conftest import MODEL, StartSim, run_over_http

DAY = 86_400


def _pages(sim: Simulator, path: str) -> list[dict[str, Any]]:
    """Every page, one bucket per page (so the cursor is followed), from two days back."""
    start = int(time.time()) // DAY * DAY - 2 * DAY
    pages, cursor = [], None
    while True:
        params: dict[str, Any] = {"start_time": start, "end_time": start + 3 * DAY, "limit": 1}
        params |= {"group_by": "model"} if "usage" in path else {}
        if cursor is not None:
            params["page"] = cursor
        page = httpx.get(f"{sim.base_url}{path}", params=params, timeout=5).json()
        pages.append(page)
        cursor = page["next_page"]
        if not page["has_more"]:
            return pages


def _report(sim: Simulator, tmp_path: Path) -> Path:
    pages = _pages(sim, "/organization/usage/completions") + _pages(sim, "/organization/costs")
    assert len(pages) == 6
    path = tmp_path / "report.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in pages))
    return path


@pytest.fixture
def ran(
    engine: Engine, cli_store: dict[str, str], tmp_path: Path, start_sim: StartSim
) -> Simulator:
    text = "order 1234 arrived late and the box was damaged, please refund. " * 90
    import_records(
        engine,
        tmp_path,
        [
            {"tenant_id": t, "post_id": f"p{i}", "text": f"{i} {text}"}
            for t in ("acme", "globex")
            for i in range(10)
        ],
    )
    sim = start_sim(cached_prefix_tokens=1200, usage_shape="full")
    for tenant, tier in (("acme", Tier.STANDARD), ("globex", Tier.FLEX)):
        run_over_http(engine, sim, [tenant], tier=tier)
    return sim


def _reconcile(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["usage", "--reconcile", str(path), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_an_exact_ledger_reconciles(
    ran: Simulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc = _reconcile(_report(ran, tmp_path), capsys)
    assert doc["differences"] == []
    assert (code, doc["cost_compared"]) == (0, True)
    assert ran.meter.snapshot().billed_cost_nanos > 0
    assert sum(c.cached_tokens for c in ran.meter.snapshot().billed.values()) > 0


@pytest.mark.parametrize(
    ("tamper", "fields"),
    [
        ("UPDATE ledger_events SET tokens_out = tokens_out + 1", ["tokens_out"]),
        ("UPDATE ledger_events SET tokens_cached = 0", ["tokens_cached"]),
        ("DELETE FROM ledger_events", ["requests", "tokens_in", "tokens_cached", "tokens_out"]),
        ("UPDATE ledger_events SET cost_nanos = cost_nanos + 10000000", ["cost_usd"]),
    ],
)
def test_a_tampered_ledger_fails_naming_the_line(
    ran: Simulator,
    engine: Engine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tamper: str,
    fields: list[str],
) -> None:
    report = _report(ran, tmp_path)
    with engine.begin() as conn:
        one = conn.execute(
            sa.text("SELECT min(id) FROM ledger_events WHERE type = 'usage'")
        ).scalar_one()
        conn.execute(sa.text(f"{tamper} WHERE id = :id"), {"id": one})
    code, doc = _reconcile(report, capsys)
    assert code == 1 and [d["field"] for d in doc["differences"]] == fields
    field = fields[0]
    assert main(["usage", "--reconcile", str(report)]) == 1
    out = capsys.readouterr().out
    assert f"{MODEL if field != 'cost_usd' else '*'} {field}: ledger " in out
    assert "DIFFERENT" in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ('{"data": [{"start_time": 0, "results": []}]}\nnot json\n', "line 2: not JSON"),
        ('{"object": "page"}', "page 1: expected an object with a 'data' list"),
        ('{"data": [{"start_time": "monday", "results": []}]}', "page 1, bucket 1: start_time"),
        ('{"data": [{"start_time": 0, "results": [{"input_tokens": 5}]}]}', "no model"),
        (
            '{"data": [{"start_time": 0, "results": [{"model": "m", "input_tokens": -5}]}]}',
            "result 1: input_tokens is not a token count",
        ),
    ],
)
def test_a_bad_report_is_refused_with_where(text: str, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        read_report(text)


def test_the_cli_refuses_a_bad_report_with_exit_2(
    cli_store: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": 3}')
    assert main(["usage", "--reconcile", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.json: page 1" in err and "Traceback" not in err
    assert main(["usage", "--reconcile", str(tmp_path / "missing.json")]) == 2


def test_an_oversized_report_is_refused_before_it_is_read(
    cli_store: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(65 << 20)  # sparse: nothing is written, the size is what counts
    assert main(["usage", "--reconcile", str(huge)]) == 2
    assert "over 64 MiB" in capsys.readouterr().err
