"""Another revision against this checkout, alternating, in one window (the machines drift).

    bench/run ab --base REV [--rounds 4] BENCH [ARGS...]
    e.g. bench/run ab --base adce78e --rounds 4 scale --seed --repeat 1

Checks REV out into a temporary ``git worktree`` and runs ``python -m bench.<BENCH>_bench
ARGS`` there and here in turns (base, this, base, this, ...), with this virtualenv: the base
tree comes first on ``PYTHONPATH``, so its package, its benches and its ``dagster.yaml`` are
used. Prints each run's figures, then the median of every number in the benches' final JSON
line, side by side. REV must install with this checkout's pinned dependencies.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import ROOT, median

_MODULES = {
    "pipeline",
    "orchestration",
    "http",
    "batch",
    "shared-limit",
    "utilization",
    "scale",
    "io",
}


def _numbers(doc: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(doc, bool):
        return
    if isinstance(doc, int | float):
        yield prefix, float(doc)
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield from _numbers(v, f"{prefix}.{k}" if prefix else str(k))


def _run(tree: Path, module: str, args: list[str]) -> tuple[str, dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{module} in {tree} failed:\n{out.stderr[-4000:]}")
    lines = out.stdout.strip().splitlines()
    doc: dict[str, Any] = {}
    if lines and lines[-1].startswith("{"):
        doc = json.loads(lines.pop())
    return "\n".join(lines), doc


def main() -> None:
    """Alternate the two trees and print the figures."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base", required=True, help="the revision to compare with (git rev)")
    p.add_argument("--rounds", type=int, default=4, help="pairs of runs (default 4)")
    p.add_argument("bench", choices=sorted(_MODULES))
    p.add_argument("args", nargs=argparse.REMAINDER, help="the bench's own arguments")
    a = p.parse_args()
    module = f"bench.{a.bench.replace('-', '_')}_bench"
    rev = subprocess.run(
        ["git", "rev-parse", "--short", a.base],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    here = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    figures: dict[str, dict[str, list[float]]] = {"base": {}, "this": {}}
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(base), rev], cwd=ROOT, check=True
        )
        try:
            print(f"# ab: {a.bench} {' '.join(a.args)}; base {rev}, this {here} (+ uncommitted)")
            for i in range(1, a.rounds + 1):
                for side, tree in (("base", base), ("this", ROOT)):
                    text, doc = _run(tree, module, a.args)
                    print(f"--- {side} ({rev if side == 'base' else here}), round {i}")
                    print(text)
                    for name, value in _numbers(doc):
                        figures[side].setdefault(name, []).append(value)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)
    print(f"# medians over {a.rounds} round(s): base {rev} | this {here}")
    if not figures["base"] and not figures["this"]:
        print("(the bench printed no JSON figures on its last line: compare the rounds above)")
    for name in sorted(set(figures["base"]) | set(figures["this"])):
        b, t = figures["base"].get(name), figures["this"].get(name)
        shown = [f"{median(v):,.3f}" if v else "-" for v in (b, t)]
        ratio = f" ({median(t) / median(b):.2f}x)" if b and t and median(b) else ""
        print(f"{name}: {shown[0]} | {shown[1]}{ratio}")


if __name__ == "__main__":
    main()
