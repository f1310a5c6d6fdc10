"""The CLI's start-up: whole processes of the light commands and of a no-op ``run``.

    bench/run startup [--rounds 10] [--base REV]

Times ``--help``, ``policy check`` (the default policy), ``tenant list`` and a no-op ``run``
(every partition already done: 3 tenants x 1,000 posts imported and run first) as whole
processes (``python -m backfill_assets.cli``, with a fresh ``DAGSTER_HOME`` and SQLite store):
wall seconds and the child's CPU seconds (user + system), medians over the rounds.

With ``--base REV`` the same commands also run from REV, checked out in a temporary
``git worktree`` with its own store, alternating REV and this checkout command by command (the
machine's speed drifts), and the ratio this / REV is printed per command. REV must run with
this checkout's virtualenv. The last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, clean_env, machine_speed, median

POLICY = "backfill_assets/policies/default.yaml"
COMMANDS: dict[str, list[str]] = {
    "help": ["--help"],
    "policy_check": ["policy", "check", POLICY],
    "tenant_list": ["tenant", "list"],
    "noop_run": ["run", "--json"],
}


def _cli(tree: Path, env: dict[str, str], argv: list[str]) -> tuple[float, float]:
    """One whole process of the CLI from ``tree``: (wall s, CPU s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", *argv],
        cwd=tree,
        env={**env, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} in {tree} failed:\n{out.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _prepared(tree: Path, workdir: Path) -> dict[str, str]:
    """A store with 3 tenants x 1,000 posts, every partition run: the no-op run's start."""
    workdir.mkdir(parents=True)
    env = clean_env(
        BACKFILL_DATABASE_URL=f"sqlite:///{workdir / 'store.db'}",
        DAGSTER_HOME=str(workdir / "home"),
    )
    (workdir / "home").mkdir()
    export = workdir / "export"
    for argv in (
        ["demo-data", "--out", str(export), "--tenants", "3", "--posts", "1000"],
        ["import", str(export)],
        ["run", "--json"],
    ):
        _cli(tree, env, argv)
    return env


def main() -> None:
    """Time the commands (and REV's, alternating) and print the medians."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=10, help="runs of each command (default 10)")
    p.add_argument("--base", metavar="REV", help="also time REV's CLI, alternating with this one")
    a = p.parse_args()
    print(machine_speed())
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        trees: dict[str, Path] = {"this": ROOT}
        if a.base:
            trees = {"base": Path(tmp) / "base", "this": ROOT}
            subprocess.run(
                ["git", "worktree", "add", "--detach", "-q", str(trees["base"]), a.base],
                cwd=ROOT,
                check=True,
            )
        try:
            envs = {
                side: _prepared(tree, Path(tmp) / f"work-{side}") for side, tree in trees.items()
            }
            times: dict[str, dict[str, list[tuple[float, float]]]] = {s: {} for s in trees}
            for name, argv in COMMANDS.items():
                for side, tree in trees.items():
                    _cli(tree, envs[side], argv)  # warm-up: the page cache, .pyc files
                for _ in range(a.rounds):
                    for side, tree in trees.items():
                        times[side].setdefault(name, []).append(_cli(tree, envs[side], argv))
        finally:
            if a.base:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(trees["base"])], cwd=ROOT
                )
    figures: dict[str, Any] = {}
    for name in COMMANDS:
        row = []
        for side in trees:
            walls = [w for w, _ in times[side][name]]
            cpus = [c for _, c in times[side][name]]
            figures[f"{side}.{name}.wall_s"] = round(median(walls), 3)
            figures[f"{side}.{name}.cpu_s"] = round(median(cpus), 3)
            row.append(
                f"{side} {median(walls):.3f} s wall ({min(walls):.3f}-{max(walls):.3f}), "
                f"{median(cpus):.3f} s CPU"
            )
        if a.base:
            ratio = figures[f"this.{name}.wall_s"] / figures[f"base.{name}.wall_s"]
            row.append(f"this/base wall {ratio:.2f}x")
        print(f"{name} ({' '.join(COMMANDS[name])}): " + "; ".join(row))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
