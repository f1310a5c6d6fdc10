"""Scale benchmarks: many tenants, the seed's JSONL shape, a million posts.

    bench/run scale --tenants-bench [--posts 10000] [--repeat 1]
    bench/run scale --seed [--posts-per-tenant 10000] [--concurrency 64] [--repeat 1]
    bench/run scale --million [--posts 1000000] [--tenants 200] [--store pg|sqlite] [--concurrency 64]
                              [--repeat 1: no-op reruns; the first after a million writes pays
                               PostgreSQL's hint bits]
    bench/run scale --many-tenants [--tenants 10000] [--stores sqlite,pg]
        [--dagster accelerated,stock]
                              (10,000 x 5 posts against 10 x 5,000; store and instance alike)
    (each also takes --processes N: BACKFILL_RUN_PROCESSES for ``run``; default the CLI's;
     and --event-batch-size N: DAGSTER_EVENT_BATCH_SIZE for every command)

Every figure is the whole CLI (``backfill-moderation import`` / ``run`` / ``verify``) in a
fresh process, fresh ``DAGSTER_HOME`` and fresh store, with the zero-latency fake model.
Wall is measured around the child process; CPU is the child's and its helpers' (``os.wait4``);
peak RSS is the largest single process's (a ``run`` over N processes holds up to N times it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.common import (
    ROOT,
    clean_env,
    drop_store,
    fmt,
    machine_speed,
    median,
    new_store,
    stock_yaml,
)

PREFIX = "scale_"  # PostgreSQL bench databases
_TEXTS = (
    "Thanks for the detailed write-up, it fixed my build on the first try.",
    "Photos from the meetup are in the shared album, great turnout this year.",
    "BUY NOW!!! Limited offer on designer watches, click here http://cheap-watch.xyz",
    "Café au lait and a croissant: the only way to start a Monday.",
    "Shut up, loser, nobody asked for your opinion.",
    "Reminder: the community call moves to Thursday because of the holiday.",
    "Our team migrated to the new API last week; latency dropped by a third.",
)


@dataclass
class Measured:
    """One CLI command: wall, the child's CPU seconds (user + sys) and peak RSS, its JSON."""

    wall: float
    rss_mb: float
    doc: dict[str, Any]
    cpu: float = 0.0


def tenant_names(n: int) -> list[str]:
    """``t0000``.. (sorted order = instance order)."""
    return [f"t{i:04d}" for i in range(n)]


def records(posts: int, tenants: int) -> Iterator[dict[str, str]]:
    """``posts`` posts dealt round-robin over ``tenants`` tenants."""
    names = tenant_names(tenants)
    for i in range(posts):
        yield {
            "tenant_id": names[i % tenants],
            "post_id": f"p{i:08d}",
            "text": f"{_TEXTS[i % len(_TEXTS)]} (#{i})",
        }


def write_export(path: Path, posts: int, tenants: int) -> Path:
    """A JSONL export of ``records``."""
    with path.open("w", encoding="utf-8") as fh:
        for rec in records(posts, tenants):
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path


def write_one_post(path: Path, tenant: str) -> Path:
    """A JSONL export of one post that ``records`` never makes."""
    rec = {"tenant_id": tenant, "post_id": "one-more", "text": f"{_TEXTS[0]} (one more)"}
    path.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    return path


# ``--processes N``: BACKFILL_RUN_PROCESSES for every ``run`` (unset: the CLI's default).
_RUN_PROCESSES: dict[str, str] = {}
# Dagster settings a bench passes on (``--event-batch-size``); others are stripped.
_DAGSTER_ENV: dict[str, str] = {}


def cli_env(home: Path, store_url: str, **extra: str) -> dict[str, str]:
    """A clean environment: no BACKFILL_/DAGSTER_ settings leak in from the caller."""
    env = clean_env(
        DAGSTER_HOME=str(home), BACKFILL_DATABASE_URL=store_url, BACKFILL_FAKE_LATENCY_MS="0"
    )
    env.update(_RUN_PROCESSES)
    env.update(_DAGSTER_ENV)
    env.update(extra)
    home.mkdir(parents=True, exist_ok=True)
    return env


def cli(args: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> Measured:
    """``python -m backfill_assets.cli ARGS --json``: wall and peak RSS of that child alone."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "backfill_assets.cli", *args, "--json"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=err,
        )
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode not in ok:
        raise RuntimeError(f"{args} exited {proc.returncode}:\n{stderr[-4000:]}")
    cpu = usage.ru_utime + usage.ru_stime  # less sensitive than wall to a busy machine
    return Measured(wall, usage.ru_maxrss / 1024, _last_json(stdout), cpu)


def _last_json(stdout: str) -> dict[str, Any]:
    text = stdout.strip()
    try:
        doc: dict[str, Any] = json.loads(text)
        return doc
    except json.JSONDecodeError:
        line: dict[str, Any] = json.loads(text.splitlines()[-1]) if text else {}
        return line


def processes_of(run: Measured) -> int:
    """How many processes a ``run --json`` used."""
    return int(run.doc.get("plan", {}).get("processes", 1))


def calls_of(run: Measured) -> int:
    """Model calls of a ``run --json``."""
    return int(run.doc.get("totals", {}).get("model_calls", 0))


# --- tenants-bench -------------------------------------------------------------------------


def _tenants_once(work: Path, export: Path, tenants: int) -> dict[str, float]:
    home = work / f"home-{tenants}-{time.monotonic_ns()}"
    env = cli_env(home, f"sqlite:///{home / 'store.db'}")
    cli(["import", str(export)], env)
    full = cli(["run"], env)
    noop = cli(["run"], env)
    assert calls_of(noop) == 0, noop.doc.get("totals")
    return {
        "run_s": full.wall,
        "noop_s": noop.wall,
        "run_cpu_s": full.cpu,
        "noop_cpu_s": noop.cpu,
        "calls": calls_of(full),
        "runs": len(full.doc.get("runs", [])),
        "noop_runs": len(noop.doc.get("runs", [])),
        "processes": processes_of(full),
    }


def tenants_bench(posts: int, repeat: int, tenant_counts: list[int]) -> dict[str, Any]:
    """The same posts over few and many tenants: run and no-op rerun wall, and the ratio."""
    out: dict[int, Any] = {}
    with tempfile.TemporaryDirectory(prefix="scale-tenants-", dir=_tmp_root()) as tmp:
        work = Path(tmp)
        print(
            f"# tenants: {posts:,} posts over {tenant_counts} tenants, SQLite, {repeat} repeat(s)"
        )
        for n in tenant_counts:
            export = write_export(work / f"posts-{n}.jsonl", posts, n)
            got = [_tenants_once(work, export, n) for _ in range(repeat)]
            out[n] = {
                "run_s": median([g["run_s"] for g in got]),
                "noop_s": median([g["noop_s"] for g in got]),
                "runs": got[0]["runs"],
                "noop_runs": got[0]["noop_runs"],
            }
            print(
                f"[{n} tenants] run: {fmt([g['run_s'] for g in got], 's', 1)}, "
                f"{got[0]['runs']} Dagster run(s) in {got[0]['processes']} process(es), "
                f"{int(got[0]['calls']):,} calls; "
                f"no-op rerun: {fmt([g['noop_s'] for g in got], 's', 2)}, "
                f"{got[0]['noop_runs']} run(s); CPU run "
                f"{median([g['run_cpu_s'] for g in got]):.1f} s, no-op "
                f"{median([g['noop_cpu_s'] for g in got]):.1f} s",
                flush=True,
            )
    lo, hi = min(tenant_counts), max(tenant_counts)
    ratio = out[hi]["run_s"] / out[lo]["run_s"]
    print(
        f"ratio {hi}/{lo} tenants: {ratio:.2f}x (target <= 2x); "
        f"no-op rerun of {hi} tenants {out[hi]['noop_s']:.2f} s (target <= 5 s)"
    )
    return {"tenants": out, "ratio": ratio}


# --- seed: the per-line-fsync JSONL shape ----------------------------------------------------


def _jsonl_key(rec: dict[str, str]) -> str:
    text_hash = hashlib.sha256(rec["text"].encode()).hexdigest()
    parts = ("task-1", "prompt-1", "fake-moderator-1", rec["tenant_id"], rec["post_id"], text_hash)
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


async def _jsonl_job(export: Path, out: Path, concurrency: int) -> int:
    """The seed's shape: asyncio at fixed concurrency, one JSONL line + fsync per result,
    resume by skipping keys already in the output file. Returns the calls made."""
    done: set[str] = set()
    if out.exists():
        with out.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    done.add(json.loads(line)["key"])
                except (json.JSONDecodeError, KeyError):
                    continue  # a torn last line
    todo: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    with export.open(encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if _jsonl_key(rec) not in done:
                todo.put_nowait(rec)
    calls = todo.qsize()
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def model(rec: dict[str, str]) -> dict[str, Any]:
        await asyncio.sleep(0)  # the zero-latency fake
        label = "spam" if "http" in rec["text"] else "ok"
        return {"label": label, "confidence": 0.9, "tokens": len(rec["text"]) // 4 + 40}

    async def work() -> None:
        while not todo.empty():
            rec = todo.get_nowait()
            key = _jsonl_key(rec)
            answer = await model(rec)
            row = {"key": key, "tenant": rec["tenant_id"], "post_id": rec["post_id"], **answer}
            os.write(fd, (json.dumps(row) + "\n").encode())
            os.fsync(fd)

    try:
        await asyncio.gather(*(work() for _ in range(concurrency)))
    finally:
        os.close(fd)
    return calls


def seed_bench(per_tenant: int, concurrency: int, repeat: int) -> dict[str, Any]:
    """The CLI vs a per-line-fsync JSONL stand-in on the same posts."""
    posts = per_tenant * 3
    cli_rates, jsonl_rates, noops, jsonl_noops, cpu_rates, jsonl_cpu = [], [], [], [], [], []
    processes: list[int] = []
    with tempfile.TemporaryDirectory(prefix="scale-seed-", dir=_tmp_root()) as tmp:
        work = Path(tmp)
        export = write_export(work / "posts.jsonl", posts, 3)
        print(
            f"# seed: {posts:,} posts (3 tenants), concurrency {concurrency}, zero-latency fake, "
            f"SQLite, {repeat} repeat(s); files on {work}"
        )
        for r in range(repeat):
            home = work / f"home-{r}"
            env = cli_env(
                home, f"sqlite:///{home / 'store.db'}", BACKFILL_CONCURRENCY=str(concurrency)
            )
            cli(["import", str(export)], env)
            full = cli(["run"], env)
            assert calls_of(full) == posts, full.doc.get("totals")
            noop = cli(["run"], env)
            cli_rates.append(posts / full.wall)
            processes.append(processes_of(full))
            cpu_rates.append(posts / full.cpu)
            noops.append(noop.wall)
            out = work / f"results-{r}.jsonl"
            t0, c0 = time.perf_counter(), time.process_time()
            calls = asyncio.run(_jsonl_job(export, out, concurrency))
            jsonl_rates.append(calls / (time.perf_counter() - t0))
            jsonl_cpu.append(calls / (time.process_time() - c0))
            t0 = time.perf_counter()
            assert asyncio.run(_jsonl_job(export, out, concurrency)) == 0
            jsonl_noops.append(time.perf_counter() - t0)
    ratio = median(cli_rates) / median(jsonl_rates)
    print(
        f"CLI `import` + `run` (run wall): {fmt(cli_rates, 'items/s')}; "
        f"run process(es): {processes}"
    )
    print(f"JSONL + fsync per line stand-in: {fmt(jsonl_rates, 'items/s')}")
    print(
        f"per CPU second (user + sys): CLI {fmt(cpu_rates, 'items/s')}, "
        f"JSONL {fmt(jsonl_cpu, 'items/s')}"
    )
    print(f"ratio CLI / JSONL: {ratio:.2f}x (target >= 3x)")
    print(f"CLI no-op rerun: {fmt(noops, 's', 2)} (target <= 3 s)")
    print(f"JSONL no-op rerun: {fmt(jsonl_noops, 's', 2)}")
    return {
        "cli_items_s": median(cli_rates),
        "jsonl_items_s": median(jsonl_rates),
        "ratio": ratio,
        "cli_noop_s": median(noops),
    }


# --- million ---------------------------------------------------------------------------------


def _pg_instance(home: Path, stock: bool = False) -> tuple[dict[str, str], str]:
    """A PostgreSQL Dagster instance in ``home`` (a fresh database) and its URL; ``stock``:
    Dagster's own storage, without the accelerators."""
    url = new_store("pg", home, prefix=PREFIX)
    home.mkdir(parents=True, exist_ok=True)
    template = (ROOT / "deploy" / "dagster.postgres.yaml").read_text()
    (home / "dagster.yaml").write_text(stock_yaml(template) if stock else template)
    return {"DAGSTER_PG_URL": url}, url


@contextlib.contextmanager
def _store_and_instance(
    work: Path, home: Path, store: str, stock: bool = False
) -> Iterator[tuple[dict[str, str], str]]:
    """A fresh store on ``store`` and a Dagster instance on the same backend in ``home``
    (``stock``: Dagster's own storage, no accelerators): the extra environment (the
    instance's URL on PostgreSQL) and the store URL; the PostgreSQL databases are dropped
    afterwards."""
    dropped: list[str] = []
    try:
        if store == "pg":
            extra, instance_url = _pg_instance(home, stock)
            dropped.append(instance_url)
            store_url = new_store("pg", work, prefix=PREFIX)
        else:
            if stock:
                home.mkdir(parents=True, exist_ok=True)
                (home / "dagster.yaml").write_text(stock_yaml((ROOT / "dagster.yaml").read_text()))
            extra, store_url = {}, f"sqlite:///{home / 'store.db'}"
        dropped.append(store_url)
        yield extra, store_url
    finally:
        for url in dropped:
            drop_store(url)


def million_bench(
    posts: int, tenants: int, store: str, concurrency: int, noops: int = 1
) -> dict[str, Any]:
    """Import, run, ``noops`` no-op reruns, verify: wall and peak RSS of each command."""
    with tempfile.TemporaryDirectory(prefix="scale-million-", dir=_tmp_root()) as tmp:
        work = Path(tmp)
        export = write_export(work / "posts.jsonl", posts, tenants)
        home = work / "home"
        with _store_and_instance(work, home, store) as (extra, store_url):
            env = cli_env(home, store_url, BACKFILL_CONCURRENCY=str(concurrency), **extra)
            print(
                f"# million: {posts:,} posts over {tenants} tenants, store {store}, "
                f"Dagster instance {'PostgreSQL' if store == 'pg' else 'SQLite'}, "
                f"concurrency {concurrency} (as the throughput target's)",
                flush=True,
            )
            steps: dict[str, Measured] = {}
            steps["import"] = cli(["import", str(export)], env)
            _report("import", steps["import"], posts, 120, "<=")
            steps["run"] = cli(["run"], env)
            _report("run", steps["run"], calls_of(steps["run"]), None, "")
            print(f"[run] in {processes_of(steps['run'])} process(es)", flush=True)
            for i in range(max(1, noops)):
                name = "no-op run" if i == 0 else f"no-op run {i + 1}"
                steps[name] = cli(["run"], env)
                _report(name, steps[name], calls_of(steps[name]), 10, "<=")
            # Cost follows the work: one new post in a store of a million, then a run.
            one = write_one_post(work / "one-more.jsonl", tenant_names(tenants)[0])
            cli(["import", str(one)], env)
            steps["run, one new post"] = cli(["run"], env)
            assert calls_of(steps["run, one new post"]) == 1, steps["run, one new post"].doc
            _report("run, one new post", steps["run, one new post"], 1, None, "")
            steps["verify"] = cli(["verify", "--require-complete"], env)
            _report("verify --require-complete", steps["verify"], posts + 1, 120, "<=")
            with sa.create_engine(store_url).connect() as conn:
                results = conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one()
            usage_report(store_url)
    rate = calls_of(steps["run"]) / steps["run"].wall
    peak = max(m.rss_mb for m in steps.values())
    print(f"run: {rate:,.0f} posts/s (target >= 5,000); results rows {results:,}")
    print(f"peak RSS over all commands: {peak:,.0f} MB (target <= 1,536 MB)")
    return {k: {"wall_s": m.wall, "rss_mb": m.rss_mb} for k, m in steps.items()} | {
        "run_posts_s": rate,
        "ok": steps["verify"].doc.get("ok"),
    }


# --- many tenants: 10,000 small ones against 10 big ones ----------------------------------


def _partition_count(env: dict[str, str]) -> int:
    """Partitions of ``moderation_labels`` in the instance of ``env``."""
    code = (
        "import dagster as dg\n"
        "from backfill_assets.defs.partitions import moderation_partitions\n"
        "inst = dg.DagsterInstance.get()\n"
        "print(len(moderation_partitions.get_partition_keys(dynamic_partitions_store=inst)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


def _many_once(
    work: Path, store: str, posts: int, tenants: int, stock: bool = False
) -> dict[str, Any]:
    export = write_export(work / f"posts-{tenants}.jsonl", posts, tenants)
    home = work / f"home-{store}-{tenants}-{'stock' if stock else 'accelerated'}"
    with _store_and_instance(work, home, store, stock) as (extra, store_url):
        env = cli_env(home, store_url, **extra)
        steps = {"import": cli(["import", str(export)], env)}
        instance_url = extra.get("DAGSTER_PG_URL")
        before = _pg_counters(store_url, instance_url)
        steps["run"] = cli(["run"], env)
        after = _pg_counters(store_url, instance_url)
        # The first reading's own connection is counted by the second.
        scanned, sessions = after[0] - before[0], after[1] - before[1] - 1
        steps["no-op run"] = cli(["run"], env)
        assert calls_of(steps["no-op run"]) == 0, steps["no-op run"].doc.get("totals")
        partitions = _partition_count(env)
    return {
        "steps": steps,
        "partitions": partitions,
        "calls": calls_of(steps["run"]),
        "scanned": scanned,
        "sessions": sessions,
    }


def _pg_counters(store_url: str, instance_url: str | None) -> tuple[int, int]:
    """On PostgreSQL (-1, -1 on SQLite), through one connection to the store: the rows
    sequential scans have read in the store's tables so far (around a run, what its queries
    read beyond the indexes), and the connections opened so far to the store and the
    instance. A connection is counted once it has ended, so a reading's own is not in it."""
    if not store_url.startswith("postgresql"):
        return -1, -1
    names = [sa.engine.make_url(u).database for u in (store_url, instance_url) if u]
    engine = sa.create_engine(store_url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            scanned = conn.exec_driver_sql(
                "SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_user_tables"
            ).scalar_one()
            sessions = conn.execute(
                sa.text(
                    "SELECT coalesce(sum(sessions), 0) FROM pg_stat_database"
                    " WHERE datname = ANY(:n)"
                ),
                {"n": names},
            ).scalar_one()
            return int(scanned), int(sessions)
    finally:
        engine.dispose()


def many_tenants_bench(
    stores: list[str], tenants: int, per_tenant: int, kinds: Sequence[str] = ("accelerated",)
) -> dict[str, Any]:
    """``tenants`` x ``per_tenant`` posts, whole CLI, zero-latency fake model: import, run,
    no-op rerun (wall, peak RSS), the partition count, and the run against the same posts over
    10 tenants; for each of ``kinds`` of Dagster instance: ``accelerated`` (the templates'
    dagster.yaml) and ``stock`` (Dagster's own storage, reported as ``<store>-stock``)."""
    posts = tenants * per_tenant
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="scale-many-", dir=_tmp_root()) as tmp:
        work = Path(tmp)
        for store, kind in [(s, k) for s in stores for k in kinds]:
            stock = kind == "stock"
            print(
                f"# many tenants: {tenants:,} x {per_tenant} posts, store and instance {store}, "
                f"Dagster storage {kind}",
                flush=True,
            )
            many = _many_once(work, store, posts, tenants, stock)
            few = _many_once(work, store, posts, 10, stock)
            label = f"{store}-stock" if stock else store
            steps: dict[str, Measured] = many["steps"]
            for name, m in steps.items():
                print(f"[{label}] {name}: {m.wall:.1f} s wall, peak RSS {m.rss_mb:,.0f} MB")
            run = steps["run"]
            ratio = run.wall / few["steps"]["run"].wall
            rate = many["calls"] / run.wall
            print(
                f"[{label}] run {rate:,.0f} posts/s (target >= 1,700; <= 30 s); no-op "
                f"{steps['no-op run'].wall:.1f} s (target <= 3 s); import "
                f"{steps['import'].wall:.1f} s (target <= 10 s); peak RSS "
                f"{max(m.rss_mb for m in steps.values()):,.0f} MB (target <= 1,024); "
                f"partitions {many['partitions']:,} (target <= 12,000)",
                flush=True,
            )
            print(
                f"[{label}] 10 tenants x {posts // 10:,}: run {few['steps']['run'].wall:.1f} s; "
                f"{tenants:,} tenants take {ratio:.2f}x (target <= 2x)",
                flush=True,
            )
            print(
                f"[{label}] CPU of the run (the command and its children): {run.cpu:.1f} s "
                f"({tenants:,} tenants), {few['steps']['run'].cpu:.1f} s (10)",
                flush=True,
            )
            out[label] = {
                **{k: {"wall_s": m.wall, "rss_mb": m.rss_mb} for k, m in steps.items()},
                "run_cpu_s": run.cpu,
                "run_cpu_s_10_tenants": few["steps"]["run"].cpu,
                "partitions": many["partitions"],
                "run_posts_s": rate,
                "ratio_vs_10_tenants": ratio,
            }
            if store == "pg":
                print(
                    f"[{label}] rows read by sequential scans in the store during the run: "
                    f"{many['scanned']:,} ({tenants:,} tenants), {few['scanned']:,} (10)",
                    flush=True,
                )
                print(
                    f"[{label}] connections opened to the store and instance during the run: "
                    f"{many['sessions']:,} ({tenants:,} tenants), {few['sessions']:,} (10)",
                    flush=True,
                )
                out[label]["run_seq_scan_rows"] = many["scanned"]
                out[label]["run_seq_scan_rows_10_tenants"] = few["scanned"]
                out[label]["run_sessions"] = many["sessions"]
                out[label]["run_sessions_10_tenants"] = few["sessions"]
    return out


def usage_report(store_url: str) -> dict[str, float]:
    """The usage report (``usage``, ``tenant_usage``) read from the rollup vs the ledger
    aggregate it replaced (sql/008): medians of 5, in ms."""
    from backfill_assets.ledger.engines import engine_for
    from backfill_assets.ledger.run.usage import usage_by_day

    engine = engine_for(store_url)
    day = "date(at)" if engine.dialect.name == "sqlite" else "to_char(at, 'YYYY-MM-DD')"
    ledger = (
        f"SELECT tenant_id, model, {day}, count(*), sum(tokens_in), sum(tokens_out), sum(cost_nanos)"
        f" FROM ledger_events WHERE type = 'usage' GROUP BY tenant_id, model, {day}"
        " ORDER BY 1, 2, 3"
    )

    def ms(fn: Any) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
        return median(times)

    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT count(*) FROM ledger_events").scalar_one()
            old = ms(lambda: conn.exec_driver_sql(ledger).all())
            new = ms(lambda: usage_by_day(conn))
    finally:
        engine.dispose()
    print(
        f"[usage report] over {rows:,} ledger rows: from usage_daily {new:.2f} ms;"
        f" the ledger aggregate it replaced {old:.1f} ms (medians of 5)",
        flush=True,
    )
    return {"rollup_ms": new, "ledger_aggregate_ms": old}


def _report(name: str, m: Measured, items: int, target: float | None, op: str) -> None:
    aim = f" (target {op} {target} s)" if target is not None else ""
    print(
        f"[{name}] {m.wall:.1f} s wall{aim}, {m.cpu:.1f} s CPU, peak RSS {m.rss_mb:,.0f} MB, "
        f"{items:,} items",
        flush=True,
    )


def _tmp_root() -> str | None:
    """Temp files on the same disk as a real deployment (not tmpfs): fsync must cost."""
    return os.environ.get("SCALE_BENCH_TMP") or None


def main() -> None:
    """Parse the mode and run it; the last line is the figures as JSON."""
    p = argparse.ArgumentParser(
        prog="bench/run scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--tenants-bench", action="store_true")
    mode.add_argument("--seed", action="store_true")
    mode.add_argument("--million", action="store_true")
    mode.add_argument("--many-tenants", action="store_true")
    p.add_argument("--posts", type=int, help="posts in all (tenants-bench 10,000; million 1M)")
    p.add_argument("--tenants", type=int, default=200, help="--million: tenants")
    p.add_argument("--tenant-counts", default="3,100", help="--tenants-bench: tenant counts")
    p.add_argument("--posts-per-tenant", type=int, default=10_000, help="--seed: 3 tenants")
    p.add_argument("--concurrency", type=int, default=64, help="--seed, --million")
    p.add_argument("--store", choices=["pg", "sqlite"], default="pg", help="--million")
    p.add_argument(
        "--stores", default="sqlite,pg", help="--many-tenants: stores (and instances) to measure"
    )
    p.add_argument(
        "--dagster",
        default="accelerated,stock",
        help="--many-tenants: Dagster storages to measure: accelerated (the templates' "
        "dagster.yaml), stock (Dagster's own, no accelerators)",
    )
    p.add_argument("--repeat", type=int, default=1, help="--million: the no-op reruns")
    p.add_argument(
        "--processes", type=int, help="BACKFILL_RUN_PROCESSES for `run` (default: the CLI's)"
    )
    p.add_argument(
        "--event-batch-size",
        type=int,
        help="DAGSTER_EVENT_BATCH_SIZE for every command (Dagster batches materialisation "
        "writes on PostgreSQL; default: unset)",
    )
    a = p.parse_args()
    if a.event_batch_size is not None:
        _DAGSTER_ENV["DAGSTER_EVENT_BATCH_SIZE"] = str(a.event_batch_size)
    if a.processes is not None:
        _RUN_PROCESSES["BACKFILL_RUN_PROCESSES"] = str(a.processes)
    print(machine_speed(), flush=True)
    if a.tenants_bench:
        counts = [int(x) for x in a.tenant_counts.split(",")]
        doc = tenants_bench(a.posts or 10_000, a.repeat, counts)
    elif a.seed:
        doc = seed_bench(a.posts_per_tenant, a.concurrency, a.repeat)
    elif a.many_tenants:
        tenants = a.tenants if a.tenants != 200 else 10_000  # 200 is --million's default
        doc = many_tenants_bench(a.stores.split(","), tenants, 5, a.dagster.split(","))
    else:
        doc = million_bench(a.posts or 1_000_000, a.tenants, a.store, a.concurrency, a.repeat)
    print(json.dumps(doc, default=str), flush=True)


if __name__ == "__main__":
    main()
