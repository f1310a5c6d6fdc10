"""The CLI process: a command loads only what it uses, and the process ends without the
interpreter's teardown, losing nothing by it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import backfill_assets

PACKAGE = Path(backfill_assets.__file__).parent
# What the light commands must not load: Dagster, the provider stack, the data frame stack,
# the plotting stack.
HEAVY = (
    "dagster",
    "httpx",
    "matplotlib",
    "pandas",
    "pandera",
    "backfill_assets.providers",
    "backfill_assets.dispatch",
)
# Objects that exist once Dagster is loaded (~215,000); the parser, the settings and the
# ledger queries alone make ~70,000.
FROZEN_AFTER_DAGSTER = 150_000
# The light commands (issue 47, item 8): each is run after an import, so they read real rows.
LIGHT_COMMANDS = [
    ["--help"],
    ["policy", "check", str(PACKAGE / "policies" / "default.yaml")],
    ["tenant", "list"],
    ["rejects"],
    ["export", "--out", "{tmp}/parquet"],
    ["export", "--out", "{tmp}/csv", "--format", "csv"],
    ["review", "export", "--out", "{tmp}/review"],
]


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return _python_env(code, tmp_path, None)


def _python_env(
    code: str, tmp_path: Path, env: dict[str, str] | None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )


def test_output_hooks_and_the_store_are_finished_before_the_process_ends(tmp_path: Path) -> None:
    done = _python(
        f"""
        import atexit, logging, sys
        import sqlalchemy as sa
        from backfill_assets.cli.process import exit_process
        from backfill_assets.ledger.engines import engine_for

        from backfill_assets.accelerators.sqlite_event_log import PooledSqliteEventLogStorage
        from dagster._core.events.log import EventLogEntry

        engine = engine_for("sqlite:///{tmp_path / "store.db"}")
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (x INTEGER)"))
            conn.execute(sa.text("INSERT INTO t VALUES (1)"))
        events = PooledSqliteEventLogStorage("{tmp_path / "runs"}")
        events.store_event(EventLogEntry(
            error_info=None, level="INFO", user_message="kept", run_id="r1", timestamp=1.0
        ))
        logging.basicConfig(filename="{tmp_path / "log.txt"}")
        logging.warning("logged")
        atexit.register(lambda: print("hook ran"))
        sys.stdout.write("x" * 200_000)  # more than a pipe holds: buffered until the flush
        sys.stderr.write("to stderr")
        exit_process(3)
        """,
        tmp_path,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "x" * 200_000 + "hook ran\n"
    assert done.stderr == "to stderr"
    assert "logged" in (tmp_path / "log.txt").read_text()
    # The store's connections were closed: SQLite checkpointed its write-ahead log. So were
    # the embedded Dagster instance's event log connections, which a run keeps open.
    assert not (tmp_path / "store.db-wal").exists()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["index.db", "r1.db"]


def test_a_thread_still_working_is_waited_for(tmp_path: Path) -> None:
    done = _python(
        """
        import threading, time
        from backfill_assets.cli.process import exit_process

        def work():
            time.sleep(0.5)
            print("thread finished", flush=True)

        threading.Thread(target=work).start()
        exit_process(0)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "thread finished\n"


def test_the_command_exits_with_its_code() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", "rejects", "--bogus"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "unrecognized arguments" in done.stderr


def _store_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BACKFILL_", "DAGSTER_"))}
    return env | {
        "BACKFILL_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "DAGSTER_HOME": str(tmp_path / "home"),
    }


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A store with two tenants' posts, one line rejected."""
    tmp = tmp_path_factory.mktemp("startup")
    (tmp / "home").mkdir()
    env = _store_env(tmp)
    for argv in (
        ["demo-data", "--out", str(tmp / "x"), "--tenants", "2", "--posts", "20"],
        ["import", str(tmp / "x")],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "backfill_assets.cli", *argv],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
        assert done.returncode == 0, done.stderr
    return tmp, env


@pytest.mark.parametrize("argv", LIGHT_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_light_command_loads_neither_dagster_nor_the_provider_stack(
    argv: list[str], imported: tuple[Path, dict[str, str]]
) -> None:
    tmp, env = imported
    args = [a.format(tmp=tmp) for a in argv]
    done = _python_env(
        f"""
        import contextlib, io, json, sys
        from backfill_assets.cli import main

        with contextlib.redirect_stdout(io.StringIO()):
            code = main({args!r})
        heavy = {HEAVY!r}
        under = tuple(h + "." for h in heavy)
        loaded = sorted(m for m in sys.modules if m in heavy or m.startswith(under))
        print(json.dumps({{"code": code, "loaded": loaded}}))
        """,
        tmp,
        env,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["code"] == 0, done.stderr
    if args[:1] == ["export"] and "--format" not in args:
        # pyarrow itself imports pandas the first time it turns Python values into an array
        # (to ask whether they are a data frame), whoever calls it: the Parquet export pays it.
        assert [m for m in doc["loaded"] if m.split(".")[0] != "pandas"] == []
    else:
        assert doc["loaded"] == []


def test_run_freezes_the_heap_once_dagster_is_loaded(imported: tuple[Path, dict[str, str]]) -> None:
    # Start-up freezes only what the parser needs; ``run`` loads Dagster itself and freezes
    # again, so full collections during the run still skip those objects (process.py).
    tmp, env = imported
    done = _python_env(
        """
        import contextlib, gc, io, json, sys
        from backfill_assets.cli import main

        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["run", "--json"])
        print(json.dumps({"code": code, "frozen": gc.get_freeze_count()}))
        """,
        tmp,
        env,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["code"] == 0, done.stderr
    assert doc["frozen"] > FROZEN_AFTER_DAGSTER, doc


def test_evaluate_loads_matplotlib_only_to_draw_its_report(
    imported: tuple[Path, dict[str, str]],
) -> None:
    tmp, env = imported
    gold = PACKAGE.parent / "docs" / "policies" / "course-gold.csv"
    done = _python_env(
        f"""
        import contextlib, io, json, sys
        from backfill_assets.cli import main

        loaded = []
        for extra in ([], ["--report", "{tmp / "report"}"]):
            with contextlib.redirect_stdout(io.StringIO()):
                code = main(["evaluate", "{gold}", "--json", *extra])
            loaded.append([code, "matplotlib" in sys.modules])
        print(json.dumps(loaded))
        """,
        tmp,
        env,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[0, False], [0, True]]


def _internal_imports() -> set[str]:
    """Every ``backfill_assets`` module outside ``cli/`` that a module under ``cli/`` imports,
    at the top or inside a function, under TYPE_CHECKING too: ``from P import N`` counts as
    ``P.N`` when N is a module."""
    found: set[str] = set()
    for path in (PACKAGE / "cli").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    is_module = (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists() or (
                        PACKAGE.parent / sub.replace(".", "/") / "__init__.py"
                    ).exists()
                    names.append(sub if is_module else node.module)
            found |= {
                n
                for n in names
                if n.startswith("backfill_assets.") and not n.startswith("backfill_assets.cli")
            }
    return found


def test_the_cli_imports_at_most_fifteen_internal_modules() -> None:
    # The CLI parses and prints; it calls the runner (runner/api.py), the ledger queries
    # (runner/queries.py) and the pure domain, nothing deeper (issue 47).
    found = _internal_imports()
    assert len(found) <= 15, sorted(found)
    assert not {
        m
        for m in found
        if m.startswith(
            (
                "backfill_assets.defs",
                "backfill_assets.dispatch",
                "backfill_assets.accelerators",
                "backfill_assets.wiring",
            )
        )
    }
