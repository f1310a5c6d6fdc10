"""The wheel is the product: built from this checkout, installed into a fresh venv outside it,
it migrates its store, imports the demo data, runs and verifies from another directory.

The venv borrows the dependencies of this checkout's ``.venv`` through a ``.pth`` line (a
plain path: the editable install's finder there is never loaded), so the test takes seconds;
``.ci/run``'s Python 3.13 smoke installs everything from scratch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from backfill_tests.cli_runs import ROOT, clean_env

pytestmark = pytest.mark.slow


def _sh(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{argv}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy: a build writes build/ and *.egg-info/ beside its pyproject.toml.
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "dagster.yaml"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("backfill_assets", "sql"):
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    _sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)], out)
    [built] = out.glob("backfill_moderation-*.whl")
    return built


def test_the_wheel_carries_migrations_policy_demo_and_instance_template(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    sql = sorted(p.name for p in (ROOT / "sql").glob("*.sql"))
    assert sql and {f"backfill_assets/migrations/{n}" for n in sql} <= names
    assert {
        "backfill_assets/instance/dagster.yaml",
        "backfill_assets/policies/default.yaml",
        "backfill_assets/demo/posts.jsonl",
    } <= names
    # Any 1.13 patch release of Dagster (constraints.txt pins the tested one): a deployment
    # that runs its own Dagster can install the code location beside it.
    [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
    requires = {
        line.split(": ", 1)[1]
        for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist: ") and "extra ==" not in line
    }
    assert {
        "dagster<1.14,>=1.13",
        "dagster-webserver<1.14,>=1.13",
        "dagster-postgres<0.30,>=0.29",
    } <= requires
    # Nothing of the checkout's tests or development tools rides along.
    assert not [n for n in names if n.startswith(("backfill_tests/", "bench/"))]


def test_an_installed_wheel_backfills_the_demo_from_another_directory(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    _sh([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    site = Path(
        _sh(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path
        ).strip()
    )
    (site / "checkout_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _sh([*pip, "install", "-q", "--no-deps", str(wheel)], tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = clean_env()
    # No DAGSTER_HOME: an installed package keeps its home in the user's data directory.
    env |= {"XDG_DATA_HOME": str(tmp_path / "data"), "PATH": f"{venv / 'bin'}:{env['PATH']}"}
    where = _sh(
        [
            str(python),
            "-c",
            "import backfill_assets, importlib.resources as r;"
            "print(backfill_assets.__file__);"
            "print(r.files('backfill_assets') / 'demo' / 'posts.jsonl');"
            "print(backfill_assets.__version__)",
        ],
        elsewhere,
        env,
    ).split()
    assert where[0].startswith(str(site)), where  # the wheel's copy, not the checkout's
    demo, version = where[1], where[2]
    assert version != "0+unknown"
    cli = str(venv / "bin" / "backfill-moderation")
    migrated = json.loads(_sh([cli, "migrate", "--json"], elsewhere, env))
    assert migrated, "an installed package found no migrations"
    imported = json.loads(_sh([cli, "import", demo, "--json"], elsewhere, env))
    assert imported["imported"] == 600
    _sh([cli, "run"], elsewhere, env)
    report = json.loads(_sh([cli, "verify", "--require-complete", "--json"], elsewhere, env))
    assert report["ok"], report
    home = tmp_path / "data" / "backfill-moderation"
    assert (home / "backfill.db").is_file() and (home / "dagster.yaml").is_file()
    assert not list(elsewhere.iterdir()), "nothing is written into the working directory"
