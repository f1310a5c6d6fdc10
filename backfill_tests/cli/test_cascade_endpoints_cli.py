"""Where a cascade's stages send, through the CLI against four simulators that each accept one
key only: a stage with ``BACKFILL_MODEL_BASE_URL__<STAGE>`` sends there with
``BACKFILL_MODEL_API_KEY__<STAGE>``, and its region lanes are
``BACKFILL_MODEL_BASE_URL__<STAGE>__<REGION>``; a stage without them sends where the default
endpoint and its region lanes do. A request sent anywhere else, or with another key, would be a
401 and stop the run; so a run that ends well sent every request to its one place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.providersim.billing.meter import CHAT_ENDPOINT, MODERATIONS_ENDPOINT
from backfill_tests.conftest import import_records
from backfill_tests.providers.conftest import StartSim

POLICY = Path(__file__).resolve().parents[2] / "docs" / "policies" / "forum-moderation.yaml"
TEXTS = ["I will find you and hurt you", "you are a worthless idiot", "the match was close"]
POSTS = [
    {"tenant_id": t, "post_id": f"p{i}", "text": x}
    for t in ("acme", "eurostar")
    for i, x in enumerate(TEXTS)
]
CASCADE = """\
stages:
  - name: screen
    dialect: openai-moderation
    model: omni-moderation-latest
    decide: {when: none_label, min_score: 0.9}
  - name: first-judge
    dialect: chat-json
    model: gpt-4o-mini
"""


def _calls(sim: Any, endpoint: str) -> int:
    bill = sim.meter.snapshot().billed_by_endpoint.get(endpoint)
    return 0 if bill is None else int(bill.calls)


def _judged(engine: Engine, tenant: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM ledger_events WHERE type = 'usage' "
                    "AND model = 'gpt-4o-mini' AND tenant_id = :t"
                ),
                {"t": tenant},
            ).scalar_one()
        )


def test_each_stage_sends_to_its_own_endpoint_with_its_own_key_and_region_lanes(
    engine: Engine,
    tmp_path: Path,
    cli_store: dict[str, str],
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import_records(engine, tmp_path, POSTS)
    default, default_eu = start_sim(api_key="sk-default-0001"), start_sim(api_key="sk-eu-0002")
    judge, judge_eu = start_sim(api_key="sk-judge-0003"), start_sim(api_key="sk-judge-eu-0004")
    cascade = tmp_path / "cascade.yaml"
    cascade.write_text(CASCADE, encoding="utf-8")
    for name, value in {
        "BACKFILL_MODEL_BACKEND": "openai",
        "BACKFILL_POLICY_PATH": str(POLICY),
        "BACKFILL_CASCADE_PATH": str(cascade),
        "BACKFILL_MODEL_BASE_URL": default.base_url,
        "BACKFILL_MODEL_API_KEY": "sk-default-0001",
        "BACKFILL_MODEL_BASE_URL__EU": default_eu.base_url,
        "BACKFILL_MODEL_API_KEY__EU": "sk-eu-0002",
        "BACKFILL_MODEL_BASE_URL__FIRST_JUDGE": judge.base_url,
        "BACKFILL_MODEL_API_KEY__FIRST_JUDGE": "sk-judge-0003",
        "BACKFILL_MODEL_BASE_URL__FIRST_JUDGE__EU": judge_eu.base_url,
        "BACKFILL_MODEL_API_KEY__FIRST_JUDGE__EU": "sk-judge-eu-0004",
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["tenant", "set-region", "eurostar", "eu"]) == 0
    assert main(["run"]) == 0
    # The screen has no endpoint of its own: the default one, and the default region lane.
    assert _calls(default, MODERATIONS_ENDPOINT) > 0
    assert _calls(default_eu, MODERATIONS_ENDPOINT) > 0
    assert _calls(default, CHAT_ENDPOINT) == _calls(default_eu, CHAT_ENDPOINT) == 0
    # The judge sends only to its own endpoints, each tenant to its region's.
    assert _calls(judge, MODERATIONS_ENDPOINT) == _calls(judge_eu, MODERATIONS_ENDPOINT) == 0
    assert _calls(judge, CHAT_ENDPOINT) == _judged(engine, "acme") > 0
    assert _calls(judge_eu, CHAT_ENDPOINT) == _judged(engine, "eurostar") > 0


def test_a_stage_region_without_an_endpoint_fails_closed(
    engine: Engine,
    tmp_path: Path,
    cli_store: dict[str, str],
    start_sim: StartSim,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import_records(engine, tmp_path, POSTS)
    default, default_eu = start_sim(api_key="sk-default-0001"), start_sim(api_key="sk-eu-0002")
    judge = start_sim(api_key="sk-judge-0003")
    cascade = tmp_path / "cascade.yaml"
    cascade.write_text(CASCADE, encoding="utf-8")
    for name, value in {
        "BACKFILL_MODEL_BACKEND": "openai",
        "BACKFILL_POLICY_PATH": str(POLICY),
        "BACKFILL_CASCADE_PATH": str(cascade),
        "BACKFILL_MODEL_BASE_URL": default.base_url,
        "BACKFILL_MODEL_API_KEY": "sk-default-0001",
        "BACKFILL_MODEL_BASE_URL__EU": default_eu.base_url,
        "BACKFILL_MODEL_API_KEY__EU": "sk-eu-0002",
        "BACKFILL_MODEL_BASE_URL__FIRST_JUDGE": judge.base_url,
        "BACKFILL_MODEL_API_KEY__FIRST_JUDGE": "sk-judge-0003",
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["tenant", "set-region", "eurostar", "eu"]) == 0
    assert main(["run"]) != 0
    # The screen served the region; the judge has no EU lane, so eurostar's hard posts wait:
    # never sent to the judge's default endpoint.
    assert _calls(default_eu, MODERATIONS_ENDPOINT) > 0
    assert _judged(engine, "eurostar") == 0
    assert _calls(judge, CHAT_ENDPOINT) == _judged(engine, "acme") > 0
    assert "eu" in capsys.readouterr().err.lower()
