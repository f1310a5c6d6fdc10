"""Crash fuzzing: one backfill SIGKILLed at many random moments, then audited.

    bench/run fuzz [--store sqlite|postgres|both] [--kills 50] [--posts 1200] [--tenants 3]
                   [--seed 7] [--latency-ms 150] [--concurrency 8] [--flush-ms 100]
                   [--batch-every 5] [--startup-share 0.1] [--json]

Per store: a provider simulator in this process (lognormal latency, median ``--latency-ms``),
``--posts`` posts over ``--tenants`` tenants imported through the CLI (small partitions, so a
batch-mode run can target one), then cycles of the real ``backfill-moderation run`` (HTTP
path, ``--concurrency`` calls in flight), each SIGKILLed with its process group at a moment
drawn from a seeded RNG, until ``--kills`` kills have landed:

- a *sync* cycle is killed at a random moment after its first provider request (the window
  adapts so that the kills spread over the whole backfill), or, for ``--startup-share`` of
  them, at a random moment before it (Dagster start-up, planning, migrations);
- every ``--batch-every``-th cycle runs one partition in batch mode (``BACKFILL_DISPATCH=batch``,
  4 lines per file) and is killed from inside the simulator the moment it receives the N-th
  ``POST /v1/files`` or ``POST /v1/batches`` of the run (before answering, or a few ms later).

Then one sync run and one batch run finish the backfill, ``verify --require-complete`` audits
it, and a further sync and batch run must send nothing. Figures, from the simulator's meter:

- *re-paid*: completions billed beyond one per key (the provider charged a key twice);
- *lost per kill*: calls billed whose usage never became durable, counted after each kill;
- *bound*: kills x (concurrency + rate x flush interval), i.e. the calls in flight plus the
  calls that can finish within one group-commit flush, with the rate observed in the sync
  cycles (billed requests over the spans between each cycle's first and last request).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from backfill_assets.demo.generate import write_export
from backfill_assets.domain.work.keys import partition_of
from backfill_assets.ledger.run.submissions import OPEN_STATES
from backfill_assets.providersim import Meter, MeterSnapshot, SimConfig, Simulator
from bench.common import ROOT, clean_env, drop_store, new_store

TENANTS = ("acme", "globex", "initech", "umbrella", "hooli", "soylent")
BATCH_LINES = 4
CYCLE_TIMEOUT_S = 600.0


@dataclass
class Trap:
    """Kill the run's process group at the ``nth`` request of ``event`` ('upload'/'create')."""

    event: str
    nth: int
    delay_s: float
    pgid: int
    seen: int = 0
    fired: bool = False


class KillMeter(Meter):
    """The simulator's meter, which can SIGKILL a client the moment a request is recorded."""

    def __init__(self) -> None:
        super().__init__()
        self._trap_lock = threading.Lock()
        self._trap: Trap | None = None

    def arm(self, trap: Trap | None) -> None:
        """Set (or clear, with None) the trap."""
        with self._trap_lock:
            self._trap = trap

    def _hit(self, event: str) -> None:
        with self._trap_lock:
            trap = self._trap
            if trap is None or trap.fired or trap.event != event:
                return
            trap.seen += 1
            if trap.seen < trap.nth:
                return
            trap.fired = True
        if trap.delay_s <= 0:
            _killpg(trap.pgid)  # before the simulator answers: the client never sees it
        else:
            threading.Timer(trap.delay_s, _killpg, (trap.pgid,)).start()

    def record_upload(self) -> None:
        """A file was stored (the answer is not sent yet)."""
        super().record_upload()
        self._hit("upload")

    def record_batch_create_request(self) -> None:
        """A create arrived (the batch is created after this, whatever the client does)."""
        super().record_batch_create_request()
        self._hit("create")


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(pgid, signal.SIGKILL)


@dataclass
class Cycle:
    """One ``run`` process and how it ended."""

    n: int
    mode: str
    moment: str  # startup | dispatch | upload | create
    killed: bool
    rc: int
    wall_s: float
    delay_s: float
    billed: int = 0  # completions billed during the cycle (sync and batch lines)
    lost: int = 0  # billed calls whose usage was not durable after the kill
    span_s: float = 0.0  # first to last admitted request of a sync cycle


@dataclass
class StoreResult:
    """Figures of one store."""

    store: str
    posts: int
    kills: int
    kills_by_moment: dict[str, int]
    cycles: int
    cycles_finished_unkilled: int
    repaid: int
    repaid_per_kill: float
    lost_total: int
    lost_max_per_kill: int
    rate_per_s: float
    flush_s: float
    concurrency: int
    bound: float
    bound_per_kill: float
    within_bound: bool
    billed_calls: int
    keys_billed: int
    batch_lines_billed: int
    batch_creates: int
    verify_ok: bool
    duplicates: int
    missing: int
    cross_tenant: int
    orphan_attempts: int
    rebilled_tokens_ledger: int
    further_run_requests: int
    further_run_model_calls: int
    wall_s: float
    cycle_log: list[dict[str, Any]] = field(default_factory=list)


def _cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=CYCLE_TIMEOUT_S,
        check=False,
    )
    if check and out.returncode != 0:
        raise RuntimeError(f"{args} exited {out.returncode}:\n{out.stderr[-4000:]}")
    return out


def _last_json(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


class Fuzz:
    """The kill loop for one store."""

    def __init__(self, store: str, args: argparse.Namespace, work: Path, log: Console) -> None:
        self.store = store
        self.args = args
        self.work = work
        self.log = log
        self.rng = random.Random(f"{args.seed}:{store}")
        self.meter = KillMeter()
        self.sim = Simulator(
            SimConfig(
                latency_median_ms=args.latency_ms,
                latency_sigma=args.latency_sigma,
                seed=args.seed,
                batch_processing_ms=300.0,
            ),
            meter=self.meter,
        )
        self.url = ""
        self.engine: sa.Engine | None = None
        self.cycles: list[Cycle] = []
        self.lost: set[str] = set()
        self.first_request_s: list[float] = []

    # -- store reads -------------------------------------------------------------------------
    def _scalar(self, sql: str) -> int:
        assert self.engine is not None
        with self.engine.connect() as conn:
            return int(conn.execute(sa.text(sql)).scalar_one() or 0)

    def _pending(self) -> int:
        return self._scalar(
            "SELECT count(*) FROM posts p WHERE NOT EXISTS (SELECT 1 FROM results r"
            " WHERE r.tenant_id = p.tenant_id AND r.post_id = p.post_id)"
            " AND NOT EXISTS (SELECT 1 FROM dead_letters d"
            " WHERE d.tenant_id = p.tenant_id AND d.post_id = p.post_id)"
        )

    def _pending_partitions(self) -> list[tuple[str, int, int]]:
        """(tenant, partition, keys not done) for every partition with work left."""
        assert self.engine is not None
        sql = (
            "SELECT p.tenant_id, p.slice, count(*) FROM posts p WHERE NOT EXISTS"
            " (SELECT 1 FROM results r WHERE r.tenant_id = p.tenant_id AND r.post_id = p.post_id)"
            " GROUP BY p.tenant_id, p.slice ORDER BY p.tenant_id, p.slice"
        )
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text(sql)).all()
            levels: dict[Any, Any] = dict(
                conn.execute(sa.text("SELECT tenant_id, slice_level FROM tenants")).all()
            )
        parts: Counter[tuple[str, int]] = Counter()
        for tenant, stored, n in rows:
            level = levels.get(tenant)
            part = int(stored) if level is None else partition_of(int(stored), int(level))
            parts[(str(tenant), part)] += int(n)
        return [(t, s, n) for (t, s), n in sorted(parts.items())]

    def _booked(self) -> set[str]:
        assert self.engine is not None
        sql = "SELECT request_id FROM ledger_events WHERE type = 'usage'"
        with self.engine.connect() as conn:
            return {str(r) for r in conn.execute(sa.text(sql)).scalars() if r}

    # -- set-up ------------------------------------------------------------------------------
    def env(self, mode: str = "sync") -> dict[str, str]:
        """The run's environment: HTTP path against the simulator, this store."""
        env = clean_env(
            DAGSTER_HOME=str(self.work / f"home-{self.store}"),
            BACKFILL_DATABASE_URL=self.url,
            BACKFILL_MODEL_BACKEND="openai",
            BACKFILL_MODEL="gpt-4o-mini",
            BACKFILL_MODEL_BASE_URL=self.sim.base_url,
            BACKFILL_CONCURRENCY=str(self.args.concurrency),
            BACKFILL_FLUSH_MS=str(self.args.flush_ms),
            # Partitions of ~25 posts: a batch cycle targets one, not a whole tenant.
            BACKFILL_SLICE_TARGET_POSTS="25",
            BACKFILL_DISPATCH=mode,
        )
        if mode == "batch":
            env.update(BACKFILL_BATCH_MAX_LINES=str(BATCH_LINES), BACKFILL_BATCH_POLL_SECONDS="0.2")
        return env

    def setup(self) -> None:
        """Start the simulator, create the store, import the posts."""
        self.sim.start()
        self.url = new_store(self.store, self.work, prefix="fuzz_bench_")
        self.engine = sa.create_engine(self.url)
        per_tenant = self.args.posts // self.args.tenants
        export = self.work / f"posts-{self.store}.jsonl"
        write_export(export, list(TENANTS[: self.args.tenants]), per_tenant, bad_lines=False)
        _cli(self.env(), "import", "--json", str(export))

    def close(self) -> None:
        """Stop the simulator and drop the store."""
        self.sim.stop()
        if self.engine is not None:
            self.engine.dispose()
        if self.url:
            drop_store(self.url)

    # -- cycles ------------------------------------------------------------------------------
    def _spawn(self, mode: str, extra: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "backfill_assets.cli", "run", "--json", *extra],
            cwd=ROOT,
            env=self.env(mode),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: the kill takes every child
        )

    def _finish(self, proc: subprocess.Popen[bytes]) -> int:
        try:
            _, err = proc.communicate(timeout=CYCLE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            raise RuntimeError("a cycle did not end within the timeout") from None
        rc = int(proc.returncode)
        if rc not in (0, -signal.SIGKILL):
            raise RuntimeError(f"run exited {rc}:\n{err.decode(errors='replace')[-4000:]}")
        return rc

    def _sleep_until(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)

    def sync_cycle(self, n: int, kills_left: int) -> Cycle:
        """One sync run, killed before or after its first provider request."""
        before = self.meter.snapshot().requests_total
        startup = self.rng.random() < self.args.startup_share
        est_first = (
            sorted(self.first_request_s)[len(self.first_request_s) // 2]
            if (self.first_request_s)
            else 10.0
        )
        # Spread the kills: about pending / (kills left + 1) keys per cycle on average.
        rate = self._rate() or 20.0
        window = max(0.3, min(6.0, 2.0 * self._pending() / (kills_left + 1) / rate))
        t0, wall0 = time.monotonic(), time.time()
        proc = self._spawn("sync", [])
        if startup:
            delay = self.rng.uniform(0.0, est_first)
            self._sleep_until(proc, t0 + delay)
        else:
            while proc.poll() is None and self.meter.snapshot().requests_total == before:
                time.sleep(0.005)
            if proc.poll() is None:
                self.first_request_s.append(time.monotonic() - t0)
            delay = self.rng.uniform(0.0, window)
            self._sleep_until(proc, time.monotonic() + delay)
        _killpg(proc.pid)
        rc = self._finish(proc)
        cycle = Cycle(n, "sync", "startup" if startup else "dispatch", rc != 0, rc, 0.0, delay)
        cycle.wall_s = round(time.monotonic() - t0, 2)
        stamps = [t for t in self.meter.snapshot().timestamps if t >= wall0]
        if len(stamps) >= 2:
            cycle.span_s = stamps[-1] - stamps[0]
        return cycle

    def batch_cycle(self, n: int) -> Cycle | None:
        """One partition in batch mode, killed at its N-th upload or create request."""
        parts = self._pending_partitions()
        if not parts:
            return None
        tenant, part, pending = self.rng.choice(parts)
        chunks = max(1, -(-pending // BATCH_LINES))
        event = self.rng.choice(("upload", "create"))
        nth = self.rng.randint(1, min(3, chunks))
        delay = 0.0 if self.rng.random() < 0.5 else self.rng.uniform(0.0, 0.05)
        t0 = time.monotonic()
        proc = self._spawn("batch", ["--tenant", tenant, "--slice", f"s{part:02d}"])
        self.meter.arm(Trap(event, nth, delay, proc.pid))
        try:
            rc = self._finish(proc)
        finally:
            self.meter.arm(None)
        cycle = Cycle(n, "batch", event, rc != 0, rc, round(time.monotonic() - t0, 2), delay)
        return cycle

    def _rate(self) -> float:
        """Billed requests per second over the sync cycles' dispatch spans."""
        spans = [c for c in self.cycles if c.mode == "sync" and c.span_s > 0.5]
        total = sum(c.span_s for c in spans)
        return sum(c.billed for c in spans) / total if total else 0.0

    def _settled(self) -> MeterSnapshot:
        """The meter once the killed run's calls still at the provider have been answered."""
        snap = self.meter.snapshot()
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            time.sleep(max(0.3, 4 * self.args.latency_ms / 1000.0))
            again = self.meter.snapshot()
            if len(again.billed) == len(snap.billed):
                return again
            snap = again
        return snap

    def _account(self, cycle: Cycle, billed_before: int) -> None:
        # The provider bills a call it answers even when the client is gone.
        snap = self._settled()
        cycle.billed = len(snap.billed) - billed_before
        sync_billed = {rid for rid, call in snap.billed.items() if not call.batch_id}
        lost = sync_billed - self._booked()
        cycle.lost = len(lost - self.lost)
        self.lost |= lost
        self.cycles.append(cycle)

    def kill_loop(self) -> None:
        """Cycles until ``--kills`` kills have landed (or nothing is left to do)."""
        kills = 0
        n = 0
        while kills < self.args.kills:
            n += 1
            billed_before = len(self.meter.snapshot().billed)
            batch = self.args.batch_every > 0 and n % self.args.batch_every == 0
            cycle = self.batch_cycle(n) if batch else None
            if cycle is None:
                if self._pending() == 0:
                    self.log.print(f"[{self.store}] backfill finished after {kills} kills")
                    return
                cycle = self.sync_cycle(n, self.args.kills - kills)
            self._account(cycle, billed_before)
            kills += int(cycle.killed)
            self.log.print(
                f"[{self.store}] cycle {n:3d} {cycle.mode:5s} {cycle.moment:8s}"
                f" {'killed' if cycle.killed else 'ended '} after {cycle.wall_s:6.2f} s"
                f" (delay {cycle.delay_s:.3f} s): billed {cycle.billed:4d}, lost {cycle.lost:2d},"
                f" pending {self._pending():5d}  [kills {kills}/{self.args.kills}]"
            )

    # -- finish and verify -------------------------------------------------------------------
    def finish(self) -> dict[str, Any]:
        """Finish (batch for open chunks, then sync), verify, and check a further run is idle."""
        assert self.engine is not None
        sql = "SELECT DISTINCT tenant_id, slice FROM batch_submissions WHERE state IN :states"
        stmt = sa.text(sql).bindparams(sa.bindparam("states", expanding=True))
        with self.engine.connect() as conn:
            open_chunks = conn.execute(stmt, {"states": list(OPEN_STATES)}).all()
            levels: dict[Any, Any] = dict(
                conn.execute(sa.text("SELECT tenant_id, slice_level FROM tenants")).all()
            )
        # A chunk records its posts' stored slice; the run wants the partition that holds it.
        by_tenant: dict[str, set[int]] = {}
        for tenant, stored in open_chunks:
            level = levels.get(tenant)
            part = int(stored) if level is None else partition_of(int(stored), int(level))
            by_tenant.setdefault(str(tenant), set()).add(part)
        for tenant, parts in sorted(by_tenant.items()):
            slices = [a for p in sorted(parts) for a in ("--slice", f"s{p:02d}")]
            _cli(self.env("batch"), "run", "--json", "--tenant", tenant, *slices)
        _cli(self.env("sync"), "run", "--json")
        out = _cli(self.env(), "verify", "--require-complete", "--json", check=False)
        doc = _last_json(out)
        before = self.meter.snapshot()
        idle = [_last_json(_cli(self.env(m), "run", "--json")) for m in ("sync", "batch")]
        after = self.meter.snapshot()
        sent = (
            after.requests_total
            - before.requests_total
            + after.files_uploaded
            - before.files_uploaded
            + after.batch_create_requests
            - before.batch_create_requests
        )
        calls = sum(int(d["totals"].get("model_calls", 0)) for d in idle)
        return {"verify": doc, "verify_rc": out.returncode, "further_sent": sent, "calls": calls}

    def result(self, final: dict[str, Any], wall: float) -> StoreResult:
        """The store's figures."""
        snap: MeterSnapshot = self.meter.snapshot()
        per_key = Counter(call.correlation_id for call in snap.billed.values())
        repaid = sum(n - 1 for n in per_key.values())
        killed = [c for c in self.cycles if c.killed]
        kills = len(killed)
        rate = self._rate()
        flush_s = self.args.flush_ms / 1000.0
        per_kill_bound = self.args.concurrency + rate * flush_s
        verify = final["verify"]
        problems = Counter(p["kind"] for p in verify["problems"])
        return StoreResult(
            store=self.store,
            posts=self.args.posts // self.args.tenants * self.args.tenants,
            kills=kills,
            kills_by_moment=dict(Counter(f"{c.mode}:{c.moment}" for c in killed)),
            cycles=len(self.cycles),
            cycles_finished_unkilled=len(self.cycles) - kills,
            repaid=repaid,
            repaid_per_kill=round(repaid / kills, 2) if kills else 0.0,
            lost_total=sum(c.lost for c in self.cycles),
            lost_max_per_kill=max((c.lost for c in killed), default=0),
            rate_per_s=round(rate, 2),
            flush_s=flush_s,
            concurrency=self.args.concurrency,
            bound=round(kills * per_kill_bound, 1),
            bound_per_kill=round(per_kill_bound, 2),
            within_bound=repaid <= kills * per_kill_bound,
            billed_calls=len(snap.billed),
            keys_billed=len(per_key),
            batch_lines_billed=sum(1 for c in snap.billed.values() if c.batch_id),
            batch_creates=snap.batch_creates_total,
            verify_ok=bool(verify["ok"]) and final["verify_rc"] == 0,
            duplicates=problems.get("duplicate", 0),
            missing=sum(int(t["missing"]) for t in verify["tenants"]),
            cross_tenant=problems.get("isolation", 0),
            orphan_attempts=sum(int(t["orphan_attempts"]) for t in verify["tenants"]),
            rebilled_tokens_ledger=sum(int(t["rebilled_tokens"]) for t in verify["tenants"]),
            further_run_requests=int(final["further_sent"]),
            further_run_model_calls=int(final["calls"]),
            wall_s=round(wall, 1),
            cycle_log=[asdict(c) for c in self.cycles],
        )


def fuzz_store(store: str, args: argparse.Namespace, work: Path, log: Console) -> StoreResult:
    """Set up, kill ``--kills`` times, finish, verify, tear down."""
    fuzz = Fuzz(store, args, work, log)
    t0 = time.monotonic()
    try:
        fuzz.setup()
        fuzz.kill_loop()
        final = fuzz.finish()
        return fuzz.result(final, time.monotonic() - t0)
    finally:
        fuzz.close()


ROWS = [
    ("posts", "posts"),
    ("kills", "kills"),
    ("kills_by_moment", "kills by moment"),
    ("cycles_finished_unkilled", "cycles that ended before their kill"),
    ("billed_calls", "completions billed"),
    ("keys_billed", "keys billed"),
    ("batch_lines_billed", "  of them batch lines"),
    ("batch_creates", "batches created"),
    ("repaid", "re-paid (billed beyond one per key)"),
    ("repaid_per_kill", "re-paid per kill"),
    ("lost_total", "lost after kills (sum)"),
    ("lost_max_per_kill", "lost, worst kill"),
    ("rate_per_s", "observed rate (calls/s)"),
    ("bound_per_kill", "bound per kill (in flight + rate x flush)"),
    ("bound", "bound (kills x per kill)"),
    ("within_bound", "re-paid <= bound"),
    ("duplicates", "verify: duplicates"),
    ("missing", "verify: missing"),
    ("cross_tenant", "verify: cross-tenant rows"),
    ("orphan_attempts", "verify: orphan attempts"),
    ("rebilled_tokens_ledger", "verify: rebilled tokens in the ledger"),
    ("verify_ok", "verify --require-complete ok"),
    ("further_run_requests", "further run: requests sent"),
    ("further_run_model_calls", "further run: model calls"),
    ("wall_s", "wall (s)"),
]


def _print_table(results: list[StoreResult], console: Console) -> None:
    table = Table(title="crash fuzzing: SIGKILLs at random moments, then resume")
    table.add_column("figure")
    for r in results:
        table.add_column(r.store, justify="right")
    for attr, label in ROWS:
        table.add_row(label, *[str(getattr(r, attr)) for r in results])
    console.print(table)
    for r in results:
        console.print(
            f"{r.store}: re-paid {r.repaid} ({r.repaid_per_kill}/kill) vs bound {r.bound}"
            f" = {r.kills} kills x ({r.concurrency} in flight + {r.rate_per_s}/s x {r.flush_s} s);"
            f" verify: {r.duplicates} duplicates, {r.missing} missing,"
            f" {r.cross_tenant} cross-tenant; further run sent {r.further_run_requests} requests"
        )


def main() -> None:
    """Parse options, fuzz each store, print the figures; exit 1 if a guarantee failed."""
    p = argparse.ArgumentParser(
        prog="bench/run fuzz",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    p.add_argument("--kills", type=int, default=50, help="SIGKILLs per store")
    p.add_argument("--posts", type=int, default=1200, help="posts in all (split over tenants)")
    p.add_argument("--tenants", type=int, default=3, choices=range(1, len(TENANTS) + 1))
    p.add_argument("--seed", type=int, default=7, help="seed of the kill moments and simulator")
    p.add_argument("--latency-ms", type=float, default=150.0, help="simulator median latency")
    p.add_argument("--latency-sigma", type=float, default=0.3, help="lognormal sigma")
    p.add_argument("--concurrency", type=int, default=8, help="BACKFILL_CONCURRENCY")
    p.add_argument("--flush-ms", type=int, default=100, help="BACKFILL_FLUSH_MS")
    p.add_argument(
        "--batch-every", type=int, default=5, help="every N-th cycle in batch mode (0: never)"
    )
    p.add_argument(
        "--startup-share",
        type=float,
        default=0.1,
        help="share of sync kills drawn before the first provider request",
    )
    p.add_argument("--json", action="store_true", help="also print one JSON line")
    p.add_argument("--cycle-log", action="store_true", help="include every cycle in the JSON")
    args = p.parse_args()
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    console = Console(stderr=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="fuzz-bench-") as tmp:
        for store in stores:
            results.append(fuzz_store(store, args, Path(tmp), console))
    _print_table(results, Console())
    if args.json:
        docs = [asdict(r) for r in results]
        if not args.cycle_log:
            for d in docs:
                d.pop("cycle_log")
        print(json.dumps({"args": vars(args), "stores": docs}, sort_keys=True), flush=True)
    failed = [
        r.store
        for r in results
        if not r.verify_ok
        or r.duplicates
        or r.missing
        or r.cross_tenant
        or r.further_run_requests
        or r.further_run_model_calls
    ]
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
