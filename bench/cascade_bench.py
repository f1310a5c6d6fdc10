"""A strong model alone against the optimiser's cascade, over a generated archive.

    bench/run cascade [--posts 100000] [--gold 1000] [--tenants 20] [--harmless 0.85]
                      [--strong gpt-4o] [--screen omni-moderation-latest] [--drop 0.01]
                      [--latency-ms 5] [--concurrency 64] [--seed 7]

The archive and its gold set come from the simulator's corpus generator
(``python -m backfill_assets.providersim.corpus``: a true label and a difficulty per post, 85%
harmless) under ``docs/policies/forum-moderation.yaml``; one simulator (``provider-sim --corpus``)
answers every model by its accuracy per difficulty (docs/providers.md, "The corpus generator").
Everything goes through the CLI, each mode in a store of its own:

1. ``strong``: ``evaluate`` the gold set with the strong model (its gold macro-F1), then ``run``
   the whole archive through it;
2. ``cascade``: ``evaluate GOLD --cascade FILE`` sends every gold post to the screen and to the
   strong model once and sweeps the screen's threshold over the stored answers. Its "screen off"
   setting is the strong model alone on the same rows; the target is that setting's macro-F1
   interval lower bound minus ``--drop`` (the optimiser compares lower bounds, so the strong
   model is held to the same statistic). ``--target-macro-f1`` then picks (from the stored
   answers: no call) and writes the cheapest cascade whose lower bound reaches it, and ``run``
   sends the archive through it.

Printed per mode: the gold set's macro-F1, the archive's macro-F1 against the corpus's true
labels, the booked cost per 1,000 archive posts (the ledger, equal to the simulator's bill), its
ratio to the strong model's (target: at most 0.35x), and the wall time of the run; for the
cascade also the optimiser's own cost (the gold set's calls) and time, and the share of posts
each stage decided.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from backfill_assets.domain.money.nanos import usd_text
from backfill_assets.domain.policy.evaluation import figures
from bench.common import ROOT, clean_env, machine_speed

POLICY = ROOT / "docs" / "policies" / "forum-moderation.yaml"
CLI = [sys.executable, "-m", "backfill_assets.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> str:
    done = subprocess.run(
        [*CLI, *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode not in ok:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout


def _archive_figures(store: str, model: str, truth: dict[str, str], labels: list[str]) -> Any:
    """The archive's labels (one per post, of ``model``) against the corpus's true labels."""
    engine = sa.create_engine(store)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT r.content_hash, r.label FROM results r JOIN tenants t "
                "ON t.tenant_id = r.tenant_id WHERE r.model = :m AND t.purpose IS NULL"
            ),
            {"m": model},
        ).all()
    engine.dispose()
    pairs = [(truth[h], str(label)) for h, label in rows if h in truth]
    return figures([e for e, _a in pairs], [a for _e, a in pairs], labels), len(pairs)


def _booked(store: str) -> tuple[int, int]:
    """Nano-dollars and usage events booked for the archive's tenants (not the gold set's)."""
    engine = sa.create_engine(store)
    with engine.connect() as conn:
        cost, calls = conn.execute(
            sa.text(
                "SELECT coalesce(sum(e.cost_nanos), 0), count(*) FROM ledger_events e "
                "JOIN tenants t ON t.tenant_id = e.tenant_id "
                "WHERE e.type = 'usage' AND t.purpose IS NULL"
            )
        ).one()
    engine.dispose()
    return int(cost), int(calls)


def _gold_booked(store: str) -> int:
    engine = sa.create_engine(store)
    with engine.connect() as conn:
        cost = conn.execute(
            sa.text(
                "SELECT coalesce(sum(e.cost_nanos), 0) FROM ledger_events e JOIN tenants t "
                "ON t.tenant_id = e.tenant_id WHERE e.type = 'usage' AND t.purpose IS NOT NULL"
            )
        ).scalar_one()
    engine.dispose()
    return int(cost)


def _per_1000(nanos: int, posts: int) -> str:
    return usd_text(int(Decimal(nanos) * 1000 / posts)) if posts else "-"


def main() -> None:
    """Generate, serve, run both modes, print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=100_000)
    parser.add_argument("--gold", type=int, default=1_000)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--harmless", type=float, default=0.85)
    parser.add_argument("--strong", default="gpt-4o")
    parser.add_argument("--screen", default="omni-moderation-latest")
    parser.add_argument("--drop", type=float, default=0.01)
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(machine_speed())
    with tempfile.TemporaryDirectory(prefix="cascade-bench-") as tmp:
        work = Path(tmp)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "backfill_assets.providersim.corpus",
                *("--posts", str(args.posts), "--gold", str(args.gold)),
                *("--tenants", str(args.tenants), "--harmless", str(args.harmless)),
                *("--seed", str(args.seed), "--policy", str(POLICY), "--out", str(work)),
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        corpus = json.loads((work / "corpus.json").read_text("utf-8"))
        truth = {h: str(p["label"]) for h, p in corpus["posts"].items()}
        port = _free_port()
        sim = subprocess.Popen(
            [
                *CLI,
                "provider-sim",
                *("--port", str(port), "--latency-ms", str(args.latency_ms)),
                *("--corpus", str(work / "corpus.json"), "--seed", str(args.seed)),
            ],
            cwd=ROOT,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert sim.stdout is not None
            sim.stdout.readline()  # "provider-sim listening on ..."
            base = f"http://127.0.0.1:{port}/v1"
            rows = _modes(args, work, base, truth)
        finally:
            sim.terminate()
            sim.wait(timeout=30)
    _print(rows, args)


def _env(work: Path, name: str, base: str, args: argparse.Namespace) -> dict[str, str]:
    home = work / f"home-{name}"
    home.mkdir()
    return clean_env(
        DAGSTER_HOME=str(home),
        BACKFILL_DATABASE_URL=f"sqlite:///{work / f'{name}.db'}",
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_BASE_URL=base,
        BACKFILL_POLICY_PATH=str(POLICY),
        BACKFILL_CONCURRENCY=str(args.concurrency),
        PATH=os.environ.get("PATH", ""),
    )


def _modes(
    args: argparse.Namespace, work: Path, base: str, truth: dict[str, str]
) -> list[dict[str, Any]]:
    labels = json.loads(
        _cli(["policy", "check", "--json", str(POLICY)], clean_env(PATH=os.environ["PATH"]))
    )["labels"]
    label_ids = [str(x["id"]) for x in labels]
    gold = str(work / "gold.csv")
    posts = str(work / "posts.jsonl")
    out: list[dict[str, Any]] = []
    # The strong model alone.
    env = {**_env(work, "strong", base, args), "BACKFILL_MODEL": args.strong}
    _cli(["import", posts], env)
    doc = json.loads(_cli(["evaluate", gold, "--json"], env))
    strong_f1 = float(doc["policies"][0]["macro_f1"])
    started = time.perf_counter()
    _cli(["run"], env, ok=(0, 1))
    wall = time.perf_counter() - started
    fig, n = _archive_figures(env["BACKFILL_DATABASE_URL"], args.strong, truth, label_ids)
    cost, calls = _booked(env["BACKFILL_DATABASE_URL"])
    out.append(
        {
            "mode": f"{args.strong} alone",
            "gold_f1": strong_f1,
            "archive_f1": fig.macro_f1,
            "posts": n,
            "cost": cost,
            "calls": calls,
            "wall": wall,
        }
    )
    # The optimiser's cascade.
    env = _env(work, "cascade", base, args)
    _cli(["import", posts], env)
    draft = work / "draft.yaml"
    draft.write_text(
        "stages:\n"
        "  - name: screen\n"
        "    dialect: openai-moderation\n"
        f"    model: {args.screen}\n"
        "    decide: {when: none_label, min_score: 0.9}\n"
        "  - name: judge\n"
        "    dialect: chat-json\n"
        f"    model: {args.strong}\n",
        encoding="utf-8",
    )
    chosen = work / "chosen.yaml"
    started = time.perf_counter()
    # First the sweep alone (every gold post through every stage, once): its "screen off"
    # setting is the strong model alone, measured on the same gold rows by the same interval.
    swept = json.loads(_cli(["evaluate", gold, "--cascade", str(draft), "--json"], env))
    alone = next(x for x in swept["settings"] if x["rules"][0]["when"] is None)
    target = max(0.0, float(alone["macro_f1_ci95"][0]) - args.drop)
    # Then the choice: the stored answers are swept again, no call is made.
    sweep = json.loads(
        _cli(
            [
                *("evaluate", gold, "--cascade", str(draft)),
                *("--target-macro-f1", f"{target:.4f}", "--write", str(chosen), "--json"),
            ],
            env,
            ok=(0, 1),
        )
    )
    optimiser_s = time.perf_counter() - started
    optimiser_cost = _gold_booked(env["BACKFILL_DATABASE_URL"])
    if not chosen.exists():
        raise RuntimeError(f"no setting reaches macro-F1 {target:.4f}: {sweep.get('error')}")
    env["BACKFILL_CASCADE_PATH"] = str(chosen)
    started = time.perf_counter()
    report = json.loads(_cli(["run", "--json"], env, ok=(0, 1)))
    wall = time.perf_counter() - started
    fig, n = _archive_figures(env["BACKFILL_DATABASE_URL"], "cascade", truth, label_ids)
    cost, calls = _booked(env["BACKFILL_DATABASE_URL"])
    out.append(
        {
            "mode": "optimiser's cascade",
            "gold_f1": sweep["chosen"]["macro_f1"],
            "target": target,
            "alone_ci": alone["macro_f1_ci95"],
            "chosen_ci": sweep["chosen"]["macro_f1_ci95"],
            "archive_f1": fig.macro_f1,
            "posts": n,
            "cost": cost,
            "calls": calls,
            "wall": wall,
            "optimiser_s": optimiser_s,
            "optimiser_cost": optimiser_cost,
            "chosen": chosen.read_text("utf-8"),
            "stages": report.get("stages", []),
        }
    )
    return out


def _print(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    base = rows[0]["cost"] or 1
    print(
        f"# {args.posts:,} posts ({args.harmless:.0%} harmless), gold {args.gold:,}; "
        f"strong {args.strong}, screen {args.screen}; target: the strong model's gold "
        f"interval lower bound - {args.drop}"
    )
    print("| mode | gold macro-F1 | archive macro-F1 | per 1,000 posts | vs strong | calls | run |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        gold = f"{r['gold_f1']:.4f}" if r["gold_f1"] is not None else "-"
        print(
            f"| {r['mode']} | {gold} | {r['archive_f1']:.4f} | ${_per_1000(r['cost'], r['posts'])} "
            f"| {r['cost'] / base:.3f}x | {r['calls']:,} | {r['wall']:.1f} s |"
        )
    c = rows[-1]
    lo, hi = c["alone_ci"]
    print(
        f"target: the strong model alone's gold macro-F1 interval [{lo:.4f}, {hi:.4f}], lower "
        f"bound - {args.drop} = {c['target']:.4f}; the chosen setting's interval "
        f"[{c['chosen_ci'][0]:.4f}, {c['chosen_ci'][1]:.4f}]"
    )
    print(f"optimiser: {c['optimiser_s']:.1f} s, gold set's calls ${usd_text(c['optimiser_cost'])}")
    for s in c["stages"]:
        print(f"stage {s['stage']}: sent {s['sent']:,}, decided {s['decided']:,}")
    print("chosen cascade:\n" + c["chosen"])


if __name__ == "__main__":
    main()
