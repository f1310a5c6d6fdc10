"""Shared bench helpers: stores, medians, subprocess workers."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
PG_BASE = os.environ.get(
    "BACKFILL_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
)


# Dagster's UI skips its first-visit community dialog once the browser holds this key
# (``CommunityNux``: Dagster's own record of a dismissal).
_NO_COMMUNITY_DIALOG = "try { localStorage.setItem('communityNux', '\"1\"') } catch (e) {}"


def keep_community_dialog_shut(page: Any) -> None:
    """Keep Dagster's community dialog from opening on ``page`` (a Playwright page): it opens a
    second after a page loads, over whatever is open (over a launch dialog its Skip button
    cannot be clicked, and it covers what a bench times). The page is told it was dismissed
    before any page loads; a handler clicks Skip should a Dagster record it elsewhere."""
    page.add_init_script(_NO_COMMUNITY_DIALOG)
    page.add_locator_handler(
        page.get_by_text("Join the Dagster community"),
        lambda _loc: page.get_by_role("button", name="Skip").click(),
    )


def clean_env(**values: str) -> dict[str, str]:
    """This process's environment without any ``BACKFILL_*`` or ``DAGSTER_*`` setting (none of
    the caller's leaks into a measured command), plus ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BACKFILL_", "DAGSTER_"))}
    env.update(values)
    return env


def stock_yaml(text: str) -> str:
    """One of the project's dagster.yaml templates without the accelerators (no
    ``instance_class`` nor its ``backfill_daemon``; ``storage: postgres`` for
    ``storage: custom``): the instance a
    deployment that adds the code location to its own Dagster has."""
    import yaml

    doc: dict[str, Any] = yaml.safe_load(text) or {}
    doc.pop("instance_class", None)
    doc.pop("backfill_daemon", None)  # a setting of the project's instance class
    custom = (doc.get("storage") or {}).get("custom")
    if custom is not None:
        doc["storage"] = {"postgres": custom.get("config", {})}
    return yaml.safe_dump(doc, sort_keys=False)


def new_store(kind: str, workdir: Path, prefix: str = "bf_bench_") -> str:
    """A fresh, empty store URL (a PostgreSQL database named ``prefix`` + a random tail)."""
    if kind == "sqlite":
        return f"sqlite:///{workdir / f'store-{uuid.uuid4().hex[:6]}.db'}"
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_BASE, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return sa.engine.make_url(PG_BASE).set(database=name).render_as_string(hide_password=False)


def drop_store(url: str) -> None:
    """Drop a PostgreSQL bench database (SQLite files live in the temp dir)."""
    if not url.startswith("postgresql"):
        return
    name = sa.engine.make_url(url).database
    admin = sa.create_engine(PG_BASE, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def worker(module: str, args: Sequence[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m module args`` in a fresh process; its last stdout line is JSON."""
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{out.stderr[-4000:]}")
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


# Runs a command and writes its peak RSS (KiB) to a file. A child's ``ru_maxrss`` starts from
# its parent's peak at the fork, so a measured command is started by this small process, never
# by a bench or test process that may have grown.
_LAUNCHER = (
    "import resource, subprocess, sys\n"
    "code = subprocess.call(sys.argv[2:])\n"
    "with open(sys.argv[1], 'w') as fh:\n"
    "    fh.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    "sys.exit(code)\n"
)


def run_peak(
    argv: Sequence[str], env: dict[str, str], timeout: float = 300
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``argv`` as a child process, its output captured, with its own peak RSS in MiB."""
    with tempfile.TemporaryDirectory() as tmp:
        peak = Path(tmp) / "peak"
        launch = [sys.executable, "-c", _LAUNCHER, str(peak), *argv]
        done = subprocess.run(
            launch, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        done.args = list(argv)
        return done, int(peak.read_text()) / 1024


def machine_speed() -> str:
    """A header line for comparing figures across machines: a fixed pure-Python workload (a
    loop of 5 million additions, in a fresh process), median of 3. The sessions' machines
    differ by 2x or more for the same code, so a figure without it says little."""
    code = (
        "import time\n"
        "t = time.perf_counter()\n"
        "s = 0\n"
        "for i in range(5_000_000):\n"
        "    s += i\n"
        "print(time.perf_counter() - t)"
    )
    runs = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(3)
    ]
    return f"# machine: reference loop {median(runs) * 1000:.0f} ms (5M additions, median of 3)"


def median(values: Sequence[float]) -> float:
    """Median (the machines are noisy)."""
    return float(statistics.median(values))


def fmt(values: Sequence[float], unit: str, digits: int = 0) -> str:
    """'median unit (min-max, n=3)'."""
    return f"{median(values):,.{digits}f} {unit} (min {min(values):,.{digits}f}, max {max(values):,.{digits}f}, n={len(values)})"
