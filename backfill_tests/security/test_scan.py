"""The scan: after real CLI runs against the simulator in each hostile mode, the API key and a
marker placed in every post appear nowhere but ``posts``: not in any other table of the store
(SQLite and PostgreSQL), not in any file under ``$DAGSTER_HOME`` (run and event databases read
table by table, compressed snapshots inflated, compute logs), not on the CLI's stdout or
stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backfill_assets.ledger.engines import engine_for
from backfill_assets.providersim.config import FaultRule
from backfill_tests.cli_runs import clean_env
from backfill_tests.conftest import StartSim, import_records
from backfill_tests.security.scan import store_leaks, text_leaks, tree_leaks

API_KEY = "sk-scan-0f1e2d3c4b5a69788796"
MARKER = "ZEPHYR-MARKER-7731-quux"
# The post's own lines, short: a provider that quotes the request quotes them.
POST = f"hello there {MARKER}\nsecond line of it\nand a third one here"

# name -> (simulator config, extra environment): each a way a provider turns on its caller.
MODES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "echoing 400s": (
        {"echo_errors": True, "faults": [FaultRule(kind="400", rate=1.0, sticky=True)]},
        {},
    ),
    "5xx and malformed answers, echoed": (
        {
            "echo_errors": True,
            "faults": [FaultRule(kind="500", rate=0.3), FaultRule(kind="malformed", rate=0.3)],
        },
        {},
    ),
    "wrong key: 401": ({"api_key": "sk-the-right-one-000000"}, {}),
    "over-billing": ({"prompt_token_factor": 40.0}, {"BACKFILL_TENANT_BUDGET_TOKENS": "5000000"}),
    "batch, echoing": (
        {"echo_errors": True, "faults": [FaultRule(kind="400", rate=0.5, sticky=True)]},
        {"BACKFILL_DISPATCH": "batch", "BACKFILL_BATCH_POLL_SECONDS": "0.05"},
    ),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_nothing_leaks_outside_posts(
    mode: str, store_url: str, tmp_path: Path, start_sim: StartSim
) -> None:
    config, extra = MODES[mode]
    sim = start_sim(**{"api_key": API_KEY, **config})
    engine = engine_for(store_url)
    records = [
        {"tenant_id": t, "post_id": f"p{i}", "text": f"{t} {i} {POST}"}
        for t in ("acme", "globex")
        for i in range(15)
    ]
    import_records(engine, tmp_path, records)
    home = tmp_path / "home"
    env = clean_env()
    env.update(
        DAGSTER_HOME=str(home),
        BACKFILL_DATABASE_URL=store_url,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL="gpt-4o-mini",
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_MODEL_API_KEY=API_KEY,
        BACKFILL_MAX_ATTEMPTS="2",
        BACKFILL_RETRY_BASE_SECONDS="0",
        BACKFILL_RETRY_MAX_SECONDS="0",
        **extra,
    )
    outputs = []
    for argv in (["run"], ["run", "--json"], ["verify"], ["check", "--tenant", "acme"]):
        done = subprocess.run(
            [sys.executable, "-m", "backfill_assets.cli", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        outputs.append((" ".join(argv), done.stdout + done.stderr))
    snap = sim.meter.snapshot()
    assert snap.requests_total + snap.files_uploaded > 0, outputs[0][1][-2000:]
    needles = [API_KEY, MARKER, "second line of it", "and a third one here"]
    leaks = store_leaks(engine, needles) + tree_leaks(home, needles)
    for name, text in outputs:
        leaks += text_leaks(name, text, needles)
    assert leaks == [], leaks[:10]
