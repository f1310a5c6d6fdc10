"""The stock-storage pass: ``BACKFILL_TEST_DAGSTER=stock`` gives every Dagster home the tests
make a ``dagster.yaml`` without the accelerators (no ``instance_class``, ``storage: postgres``
for ``storage: custom``), as a deployment that adds the code location to its own Dagster has.
``.ci/run`` runs ``STOCK_SET`` once more under it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from bench.common import stock_yaml

ROOT = Path(__file__).resolve().parents[1]
STOCK = os.environ.get("BACKFILL_TEST_DAGSTER", "") == "stock"
# The Dagster-facing tests the stock pass runs (.ci/run), ~4 min on 2 cores: the definitions
# (assets, checks, apply, the stock-instance proof), the plan (what the instance says is done),
# the run's helper processes, and the operator commands that read the checks. Left out: the
# deadline and upgrade tests of runner/ (tiers and old checkouts; their Dagster part is the
# same runs), the accelerators' own tests, the servers' (bin/dev copies its own dagster.yaml).
STOCK_SET = (
    "backfill_tests/defs",
    "backfill_tests/runner/test_plan.py",
    "backfill_tests/runner/test_run_processes.py",
    "backfill_tests/cli/test_operator.py",
)


def instance_yaml(template: Path) -> str:
    """The text a test writes into a home from ``template``: stock under the switch."""
    text = template.read_text("utf-8")
    return stock_yaml(text) if STOCK else text


def seed_home(home: str | Path | None) -> None:
    """Under the switch, give ``home`` the stock embedded dagster.yaml unless it has one (the
    CLI then keeps it, as it keeps any home's file)."""
    if not STOCK or not home:
        return
    path = Path(home) / "dagster.yaml"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(instance_yaml(ROOT / "dagster.yaml"), "utf-8")


def stock_template() -> Path:
    """A file holding the stock embedded dagster.yaml (for the CLI's template, in process)."""
    fd, name = tempfile.mkstemp(prefix="stock-dagster-", suffix=".yaml")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(instance_yaml(ROOT / "dagster.yaml"))
    return Path(name)
