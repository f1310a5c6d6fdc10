"""A big ``run`` spreads its boxes over several processes (use every core).

What must hold whatever the split: every partition of the plan is run by exactly one process,
every key is paid once, a signal stops every process's runs the same way, and a process that
dies without reporting costs a rerun of its partitions, never a result.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from backfill_assets.config.settings import Settings
from backfill_assets.defs.partitions import ensure_partitions
from backfill_assets.dispatch.pipeline import PartitionRef
from backfill_assets.domain.work.keys import MAX_LEVEL
from backfill_assets.ledger.engines import engine_for
from backfill_assets.runner import processes as run_processes
from backfill_assets.runner.instance import instance
from backfill_assets.runner.plan import make_plan
from backfill_assets.runner.pooling import Box, PartitionPlan, Plan
from backfill_assets.runner.processes import run_plan
from backfill_assets.runner.run_records import RecordedCheck, RunRecord
from backfill_assets.runner.sharing import box_weight, halve, partition_weights, share_out
from backfill_assets.wiring import build_definitions
from backfill_tests.cli_runs import clean_env, last_json
from backfill_tests.conftest import StartSim, import_records

# 40 one-partition tenants weigh enough (their Dagster events) for two processes by default.
TENANTS = [f"t{i:02d}" for i in range(40)]
PER_TENANT = 10


def _records(per_tenant: int = PER_TENANT) -> list[dict[str, Any]]:
    return [
        {"tenant_id": t, "post_id": f"p{i}", "text": f"{t} post {i}: arrived on time"}
        for t in TENANTS
        for i in range(per_tenant)
    ]


# --- the split (pure) ---------------------------------------------------------------------


def _weights(tenants: list[str], slices: int, pending: dict[str, int]) -> dict[str, float]:
    plans = [
        PartitionPlan(PartitionRef(f"s{s:02d}|{t}", t, s), 10, pending.get(t, 0), True, "")
        for t in tenants
        for s in range(slices)
    ]
    return partition_weights(Plan(plans, []))


@settings(max_examples=150, deadline=None)
@given(
    tenants=st.integers(1, 12),
    slices=st.integers(1, 16),
    processes=st.integers(1, 5),
    head_start=st.sampled_from([0, 4_000, 50_000]),
    loads=st.lists(st.integers(0, 20_000), min_size=12, max_size=12),
)
def test_shares_cover_every_partition_exactly_once(
    tenants: int, slices: int, processes: int, head_start: int, loads: list[int]
) -> None:
    names = [f"t{i:02d}" for i in range(tenants)]
    weights = _weights(names, slices, dict(zip(names, loads, strict=False)))
    order = list(weights)
    half = len(order) // 2 or 1
    boxes = [Box(tuple(order[:half]))]
    if len(order) > 1:
        boxes.append(Box(tuple(order[half:])))
    shares = share_out(boxes, weights, processes, head_start)
    assert 1 <= len(shares) <= processes
    got = Counter(k for share in shares for b in share for k in b.keys)
    assert got == Counter(k for b in boxes for k in b.keys)  # each partition once
    for share in shares:
        for b in share:  # still a box: a stretch of consecutive partitions
            at = order.index(b.start)
            assert list(b.keys) == order[at : at + b.size]


def test_the_heaviest_box_is_cut_where_it_halves_best_and_the_late_start_counts() -> None:
    names = ["a", "b", "c"]
    # Three tenants x two slices of equal work: the cut halves it exactly.
    weights = _weights(names, 2, {"a": 5_000, "b": 5_000, "c": 5_000})
    keys = tuple(weights)
    assert halve(Box(keys), weights) == (Box(keys[:3]), Box(keys[3:]))
    assert halve(Box(("s03|a",)), weights) is None  # one partition: nothing to cut
    # One tenant holds most of the work: the cut isolates it.
    weights = _weights(names, 1, {"a": 30_000, "b": 1_000, "c": 1_000})
    assert halve(Box(tuple(weights)), weights) == (Box(("s00|a",)), Box(("s00|b", "s00|c")))
    # Four equal one-partition tenants over two processes: two each with no head start; a
    # helper that starts later gets less.
    names = ["a", "b", "c", "d"]
    weights = _weights(names, 1, dict.fromkeys(names, 10_000))
    whole = Box(tuple(weights))
    even = share_out([whole], weights, 2, 0)
    assert [sum(box_weight(b, weights) for b in s) for s in even] == [20_810.0, 20_810.0]
    late = share_out([whole], weights, 2, 15_000)
    assert [sum(len(b.keys) for b in s) for s in late] == [3, 1]
    # One process: the boxes as they are.
    assert share_out([whole], weights, 1, 0) == [[whole]]


# --- whole runs ---------------------------------------------------------------------------


def _env(tmp_path: Path, url: str, **extra: str) -> dict[str, str]:
    env = clean_env()
    env.update(DAGSTER_HOME=str(tmp_path / "home"), BACKFILL_DATABASE_URL=url, **extra)
    return env


_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_run_left() -> Iterator[None]:
    """A failing test leaves no `run` behind (it would keep writing, and its pipes would be
    reported in whichever test the garbage collector next runs in)."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()  # its helpers follow (PR_SET_PDEATHSIG)
        proc.communicate(timeout=60)


def _cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "backfill_assets.cli", *args, "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _STARTED.append(proc)
    return proc


def test_a_helpers_records_reach_the_parent_whole() -> None:
    """What a helper writes (``as_doc``, JSON) reads back as the same records."""
    checks = [
        RecordedCheck("coverage", False, True, "ERROR", "coverage: 2 missing"),
        RecordedCheck("label_drift", True, False, "WARN", None),
    ]
    records = [
        RunRecord(
            run_id="r1",
            success=False,
            partitions=["s00|t1", "s01|t1"],
            metadata={"s00|t1": {"posts": 5, "cost_usd": "0.000000120", "latency_p50_ms": 0.5}},
            error="step failed",
            checks={"s00|t1": checks, "s01|t1": checks[1:]},
            applied=["s01|t1"],
            job="moderation_backfill",
            interrupted=True,
        ),
        RunRecord(run_id="r2", success=True, partitions=[]),
    ]
    sent = json.dumps([r.as_doc() for r in records], default=str)
    assert [RunRecord.from_doc(d) for d in json.loads(sent)] == records
    assert records[0].blocked() == {"s00|t1": ["coverage"]}


def _doc(stdout: str) -> dict[str, Any]:
    doc: dict[str, Any] = last_json(stdout)
    return doc


def test_a_big_run_spreads_over_two_processes_and_pays_each_key_once(
    store_url: str, tmp_path: Path, start_sim: StartSim
) -> None:
    sim = start_sim(latency_median_ms=5, latency_sigma=0.2, seed=3)
    engine = engine_for(store_url)
    import_records(engine, tmp_path, _records(), slice_target=1000)
    env = _env(
        tmp_path,
        store_url,
        BACKFILL_MODEL_BACKEND="openai",
        BACKFILL_MODEL_BASE_URL=sim.base_url,
        BACKFILL_CONCURRENCY="8",
        BACKFILL_RUN_PROCESSES="2",
    )
    proc = _cli(["run"], env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    doc = _doc(out)
    assert doc["plan"]["processes"] == 2 and doc["plan"]["runs"] >= 2
    assert len(doc["runs"]) == doc["plan"]["runs"] and all(r["success"] for r in doc["runs"])
    assert len({r["run_id"] for r in doc["runs"]}) == len(doc["runs"])
    assert doc["totals"]["model_calls"] == len(TENANTS) * PER_TENANT
    assert sorted(p["partition"] for p in doc["partitions"]) == sorted(f"s00|{t}" for t in TENANTS)
    assert all(p["applied"] for p in doc["partitions"])
    # Each key billed exactly once by the provider, each result stored once.
    billed = Counter(c.correlation_id for c in sim.meter.snapshot().billed.values())
    with engine.connect() as conn:
        keys = [k for (k,) in conn.execute(sa.text("SELECT key FROM results"))]
    assert len(keys) == len(set(keys)) == len(TENANTS) * PER_TENANT
    assert set(billed) == set(keys) and set(billed.values()) == {1}
    # Both processes' runs are in the instance, done.
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as inst:
        runs = [r.dagster_run for r in inst.get_run_records()]
    labels = [r for r in runs if r.job_name == "moderation_backfill"]
    assert {r.run_id for r in labels} == {r["run_id"] for r in doc["runs"]}
    assert {r.status for r in runs} == {dg.DagsterRunStatus.SUCCESS}
    # Nothing left: the next run starts no process and no run, and pays nothing.
    again = _cli(["run"], env)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err[-3000:]
    assert _doc(out)["plan"] == {**doc["plan"], "runs": 0, "to_run": 0, "processes": 1}
    assert len(sim.meter.snapshot().billed) == len(TENANTS) * PER_TENANT
    verify = _cli(["verify", "--require-complete"], env)
    vout, verr = verify.communicate(timeout=120)
    assert verify.returncode == 0, vout[-2000:] + verr[-2000:]


def test_small_runs_stay_in_one_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    import_records(engine_for(url), tmp_path, _records(5)[:100], slice_target=1000)
    proc = _cli(["run"], _env(tmp_path, url, BACKFILL_RUN_PROCESSES="4"))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert _doc(out)["plan"]["processes"] == 1  # 20 tenants: too little work to share


def _small_tenants(tmp_path: Path, latency_ms: int) -> tuple[Engine, dict[str, str], int]:
    """40 ten-post tenants on SQLite, a slow fake model, two processes: the store's engine,
    the CLI's environment and the number of posts."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = engine_for(url)
    import_records(engine, tmp_path, _records(10), slice_target=1000)
    env = _env(
        tmp_path,
        url,
        BACKFILL_FAKE_LATENCY_MS=str(latency_ms),
        BACKFILL_CONCURRENCY="4",
        BACKFILL_RUN_PROCESSES="2",
    )
    return engine, env, len(TENANTS) * 10


def _resumes(engine: Engine, env: dict[str, str], posts: int) -> int:
    """After a stopped run: what finished is committed with its usage, the next run re-pays
    at most the calls in flight and leaves the store complete. Returns the results kept."""
    with engine.connect() as conn:
        done = conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one()
        usage = conn.execute(
            sa.text("SELECT count(*) FROM ledger_events WHERE type = 'usage'")
        ).scalar_one()
    assert done < posts and usage == done
    again = _cli(["run"], {**env, "BACKFILL_FAKE_LATENCY_MS": "0"})
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    assert _doc(out)["totals"]["model_calls"] <= posts - done + 4  # at most those in flight
    verify = _cli(["verify", "--require-complete"], env)
    vout, _verr = verify.communicate(timeout=120)
    assert verify.returncode == 0, vout[-2000:]
    return int(done)


# SIGINT takes the same path in the parent during its run (Dagster turns both into one
# interrupt; test_signals.py sends both to a one-process run); the waiting test sends both.
@pytest.mark.xdist_group("servers")  # a timed stop: not beside the other server tests
@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_a_signal_stops_every_process_and_the_next_run_finishes(
    tmp_path: Path, signum: int
) -> None:
    engine, env, posts = _small_tenants(tmp_path, latency_ms=100)
    proc = _cli(["run"], env)
    deadline = time.monotonic() + 120
    with engine.connect() as conn:
        # Both processes are sending: results of tenants from both ends of the order.
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            got = {t for (t,) in conn.execute(sa.text("SELECT DISTINCT tenant_id FROM results"))}
            if got & set(TENANTS[:20]) and got & set(TENANTS[20:]):
                break
            time.sleep(0.2)
            conn.rollback()
    sent = time.monotonic()
    proc.send_signal(signum)  # to the parent only, as an orchestrator would
    _out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 15
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as inst:
        statuses = [r.dagster_run.status for r in inst.get_run_records()]
    assert len(statuses) >= 2 and set(statuses) == {dg.DagsterRunStatus.CANCELED}
    assert _resumes(engine, env, posts) > 0


# SIGTERM takes the same path here (the CLI maps it to the same interrupt); SIGINT is the one
# a shell may have set to be ignored.
@pytest.mark.xdist_group("servers")
@pytest.mark.parametrize("signum", [signal.SIGINT])
def test_a_signal_while_waiting_for_a_helper_stops_it(tmp_path: Path, signum: int) -> None:
    # The first share is 25 one-post tenants, the helper's holds a 400-post tenant: this
    # process is done and waiting when the signal comes. Started the way a script starts a
    # background job, with SIGINT ignored (before the fix, that SIGINT was lost and the helper
    # ran to the end).
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = engine_for(url)
    records = [r for r in _records(1) if r["tenant_id"] != TENANTS[-1]]
    records += [
        {"tenant_id": TENANTS[-1], "post_id": f"big{i}", "text": f"big post {i}"}
        for i in range(400)
    ]
    import_records(engine, tmp_path, records, slice_target=1000)
    env = _env(
        tmp_path,
        url,
        BACKFILL_FAKE_LATENCY_MS="100",
        # One call at a time: the helper's 400 posts take 40 s, far longer than this process's
        # one-post tenants, so the signal cannot come after the helper has finished.
        BACKFILL_CONCURRENCY="1",
        BACKFILL_RUN_PROCESSES="2",
    )
    home = str(tmp_path / "home")
    instance(Settings.from_env({"DAGSTER_HOME": home}))  # made first: the test polls it
    # Output to files: nothing reads a pipe while the test polls, and a full one would stall
    # the run.
    with (tmp_path / "run.log").open("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "backfill_assets.cli", "run", "--json"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        _STARTED.append(proc)
        deadline = time.monotonic() + 120
        while True:  # this process's run is done, the helper's still going
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"exited {proc.returncode} before the helper was alone: {log.read()}")
            time.sleep(0.3)
            with contextlib.suppress(Exception), dg.DagsterInstance.from_config(home) as inst:
                statuses = sorted(str(r.dagster_run.status) for r in inst.get_run_records())
                if statuses == ["DagsterRunStatus.STARTED", "DagsterRunStatus.SUCCESS"]:
                    break
        proc.send_signal(signum)
        proc.wait(timeout=30)
        log.seek(0)
        assert proc.returncode == 130, log.read()[-3000:]
        with dg.DagsterInstance.from_config(home) as inst:
            statuses = sorted(str(r.dagster_run.status) for r in inst.get_run_records())
        assert statuses == ["DagsterRunStatus.CANCELED", "DagsterRunStatus.SUCCESS"]
    with engine.connect() as conn:
        done = conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one()
    assert done < len(records)
    again = _cli(["run"], {**env, "BACKFILL_FAKE_LATENCY_MS": "0"})
    again.communicate(timeout=300)
    assert again.returncode == 0


@pytest.mark.xdist_group("servers")
def test_a_killed_run_takes_its_helpers_down_and_loses_nothing(tmp_path: Path) -> None:
    # 300 ms a call: a helper left alone would run for ~30 s.
    engine, env, posts = _small_tenants(tmp_path, latency_ms=300)
    # A temporary directory of its own: a `run` of another test sweeps the shared one of
    # records directories whose process is gone, this killed run's among them.
    records_root = tmp_path / "tmp"
    records_root.mkdir()
    env = {**env, "TMPDIR": str(records_root)}
    proc = _cli(["run"], env)
    deadline = time.monotonic() + 120
    helper: list[int] = []
    with engine.connect() as conn:
        while not helper or conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one() < 20:
            assert proc.poll() is None and time.monotonic() < deadline
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            helper = helper or [int(c) for c in children if _is_run(int(c))]
            time.sleep(0.2)
            conn.rollback()
    proc.send_signal(signal.SIGKILL)  # no handler, no cleanup: the helper must notice
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in helper):
        assert time.monotonic() < deadline, f"helper {helper} outlived its parent"
        time.sleep(0.2)
    left = list(records_root.glob(f"backfill-run-{proc.pid}-*"))
    assert left  # the killed run could not remove its records directory
    assert _resumes(engine, env, posts) >= 20
    assert not any(p.exists() for p in left)  # the next run did


def _is_run(pid: int) -> bool:
    """A forked helper runs the same command line as its parent (Dagster's log tailers don't)."""
    try:
        return b"backfill_assets.cli" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_a_helper_that_dies_costs_a_rerun_not_a_result(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = engine_for(url)
    import_records(engine, tmp_path, _records(5), slice_target=1000)
    env = {"DAGSTER_HOME": str(tmp_path / "home"), "BACKFILL_DATABASE_URL": url}
    s = Settings.from_env(env)
    inst = instance(s)
    ensure_partitions(inst, dict.fromkeys(TENANTS, MAX_LEVEL))
    # The drill hook: each helper is SIGKILLed as soon as it is forked.
    drill = Settings.from_env({**env, "BACKFILL_KILL_AT": "helper"})
    plan = make_plan(engine, inst, s.versions())
    shared = run_plan(drill, build_definitions(s), inst, plan, {}, processes=2, min_share=0)
    assert shared.processes == 2 and not shared.interrupted
    lost = [r for r in shared.records if not r.success]
    assert len(lost) == 1 and lost[0].error is not None
    assert "exited with -9 before reporting" in lost[0].error, lost[0].error
    assert "planned again by the next `run`" in lost[0].error
    done = {pk for r in shared.records for pk in r.partitions}
    assert done and len(done) < len(TENANTS)
    # The next run (one process) does exactly the partitions the dead helper held.
    plan = make_plan(engine, inst, s.versions())
    todo = {p.ref.key for p in plan.partitions if p.run}
    assert todo == {f"s00|{t}" for t in TENANTS} - done
    again = run_plan(s, build_definitions(s), inst, plan, {}, processes=1)
    assert again.processes == 1 and all(r.success for r in again.records)
    with engine.connect() as conn:
        keys = [k for (k,) in conn.execute(sa.text("SELECT key FROM results"))]
    assert len(keys) == len(set(keys)) == len(TENANTS) * 5


def test_only_the_records_of_dead_runs_are_swept(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], text=True)
    _STARTED.append(alive)
    try:
        dirs = {
            "dead": tmp_path / f"backfill-run-{gone.pid}-abc",
            "alive": tmp_path / f"backfill-run-{alive.pid}-abc",
            "mine": tmp_path / f"backfill-run-{os.getpid()}-abc",
            "old_name": tmp_path / "backfill-run-x7k2",
            "other": tmp_path / f"other-{gone.pid}-abc",
        }
        for d in dirs.values():
            d.mkdir()
            (d / "1.json").write_text("[]")
        run_processes.sweep_stale_records(str(tmp_path))
        assert {k for k, d in dirs.items() if d.exists()} == {"alive", "mine", "old_name", "other"}
    finally:
        alive.kill()
