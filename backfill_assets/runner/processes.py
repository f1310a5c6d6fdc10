"""A CLI ``run``'s boxes over several processes: one process leaves the other cores idle.

The pipeline, the checks and Dagster's event writes are CPU-bound Python. When a plan holds
enough work (``_MIN_SHARE`` keys' worth per process), ``run_plan`` shares its boxes out over up
to ``BACKFILL_RUN_PROCESSES`` processes (default: the cores, at most 4; ``sharing.share_out``):
this process runs the first share and forks a helper for each other one. Helpers are forked
once the plan is made, after the output check's pandas and pandera are loaded, so they start
with every module imported and their job in memory; the store engines they inherit are dropped
unclosed in the child (``engines._forget_engines``) and each helper opens its own instance
and engine. A small or no-op run forks nothing.

Every process runs ``orchestrate.run_boxes`` on its boxes exactly as a single process would:
boxes are disjoint, so no two processes hold a partition, and the store's guarantees (claims,
group commits, the shared provider limit, budget reservations) already hold across processes.
Each process sends at most ``BACKFILL_CONCURRENCY / processes`` calls at once, so the setting
bounds the whole command.

A helper writes its run records as JSON to a file; one that dies without writing is reported as
a failed run over its boxes (the next ``run`` plans them again). SIGINT reaches every process of
the terminal's group and SIGTERM to this process is passed on, so every run stops the same way
and is recorded as canceled; a helper whose parent dies gets SIGTERM (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from backfill_assets.config.settings import Settings
from backfill_assets.defs.instance_api import close_event_logs
from backfill_assets.domain.policy.validation import warm_up as warm_up_validation
from backfill_assets.runner.instance import instance
from backfill_assets.runner.orchestrate import run_boxes
from backfill_assets.runner.pooling import Box, Plan
from backfill_assets.runner.run_records import RunRecord
from backfill_assets.runner.sharing import partition_weights, share_out
from backfill_assets.wiring import APPLY_JOB, BACKFILL_JOB, build_definitions

# Keys' worth of work a process must get to be worth using, and what a helper needs before its
# first run starts (its instance, definitions and run set-up: ~1 s here, ~270 us a key).
_MIN_SHARE = 8_000
_START = 4_000
_MAX_DEFAULT = 4
_PR_SET_PDEATHSIG = 1
# Where helpers write their run records: a directory per `run`, named after its process.
_RECORDS_PREFIX = "backfill-run-"


def process_count(settings: Settings) -> int:
    """How many processes a ``run`` may use (``BACKFILL_RUN_PROCESSES``; 0: the cores, at most
    4). Batch dispatch waits on the provider, not the CPU, so it stays in one process."""
    if settings.batch.dispatch != "sync":
        return 1
    return settings.orchestration.run_processes or min(_MAX_DEFAULT, os.cpu_count() or 1)


@dataclass(frozen=True)
class _Helper:
    pid: int
    out: Path  # where it writes its run records
    boxes: list[Box]


@dataclass
class SharedRun:
    """What ``run_plan`` did: the plan as run (its boxes cut for the processes) and every
    process's run records, this process's first."""

    plan: Plan
    records: list[RunRecord]
    processes: int
    # SIGTERM/SIGINT arrived while this process waited for the helpers.
    stopped: bool = False

    @property
    def interrupted(self) -> bool:
        """A signal stopped this run: some runs may not have started."""
        return self.stopped or any(r.interrupted for r in self.records)


def run_plan(
    settings: Settings,
    defs: dg.Definitions,
    inst: dg.DagsterInstance,
    plan: Plan,
    regions: Mapping[str, str | None],
    processes: int | None = None,
    min_share: float = _MIN_SHARE,
) -> SharedRun:
    """Run the plan's boxes (labels, checks, the gated apply) here, and on helper processes
    when the plan holds enough work for them."""
    weights = partition_weights(plan)
    total = sum(weights.get(k, 0.0) for b in plan.boxes for k in b.keys)
    n = process_count(settings) if processes is None else processes
    if min_share > 0:
        n = min(n, int(total // min_share))
    shares = share_out(plan.boxes, weights, n, _START) if n > 1 else [list(plan.boxes)]
    if plan.boxes:
        # The output check's pandas and pandera, loaded once (and inherited by the helpers),
        # then exempted from garbage collection with the rest of the heap, so the helpers
        # share those pages instead of copying them (cli/process.py says why).
        warm_up_validation(settings.rubric().contract)
        gc.freeze()
    if len(shares) < 2:
        alone = run_boxes(
            defs, inst, BACKFILL_JOB, plan.boxes, apply_job=APPLY_JOB, regions=regions
        )
        return SharedRun(plan, alone, 1)
    mine = settings.replace(run={"concurrency": math.ceil(settings.run.concurrency / len(shares))})
    own = build_definitions(mine)
    records: list[RunRecord] = []
    stopped = False
    sweep_stale_records()
    with tempfile.TemporaryDirectory(prefix=f"{_RECORDS_PREFIX}{os.getpid()}-") as tmp:
        busy = [
            _fork(mine, share, regions, Path(tmp) / f"{i}.json")
            for i, share in enumerate(shares[1:], 1)
        ]
        try:
            records += run_boxes(
                own, inst, BACKFILL_JOB, shares[0], apply_job=APPLY_JOB, regions=regions
            )
            if any(r.interrupted for r in records):
                _signal(busy, signal.SIGTERM)  # stopped here: stop them the same way
            for h in busy:
                records += _collect(h)
        except KeyboardInterrupt:
            # SIGTERM or SIGINT outside a Dagster run: stop the helpers, report what they did.
            stopped = True
            _signal(busy, signal.SIGTERM)
            records += [r for h in busy for r in _collect(h)]
        except BaseException:
            _signal(busy, signal.SIGTERM)
            for h in busy:
                _reap(h)
            raise
    cut = dataclasses.replace(plan, boxes=[b for s in shares for b in s])
    return SharedRun(cut, records, len(shares), stopped)


def sweep_stale_records(root: str | None = None) -> None:
    """Remove the records directories of ``run`` processes that died without cleaning up
    (SIGKILL): each is named after its process, and one whose process is gone is left over.
    (Were a temporary directory shared with another PID namespace, a live run's could go too:
    that run then reports its helpers' runs as failed and the next ``run`` plans them again.)
    """
    for path in Path(root or tempfile.gettempdir()).glob(f"{_RECORDS_PREFIX}*-*"):
        pid = path.name.removeprefix(_RECORDS_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # alive, another user's
            continue


def _fork(
    settings: Settings, boxes: Sequence[Box], regions: Mapping[str, str | None], out: Path
) -> _Helper:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the helper: never returns into the caller's code
        code = 1
        try:
            drill = settings.drills.faults().at_point()
            if drill is not None:
                drill("helper")
            code = _serve(settings, boxes, regions, out)
        except BaseException:  # its last word; the parent reports a helper without records
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                # The exit hooks are the parent's: run only the event log's own.
                close_event_logs()
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    return _Helper(pid, out, list(boxes))


def _signal(busy: Sequence[_Helper], sig: int) -> None:
    for h in busy:
        with contextlib.suppress(OSError):
            os.kill(h.pid, sig)


def _reap(h: _Helper) -> int | None:
    """The helper's exit code once it exits (None if reaped already)."""
    while True:
        try:
            _pid, status = os.waitpid(h.pid, 0)
            return os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            return None
        except KeyboardInterrupt:
            # A second SIGTERM/SIGINT: the helper got the stop too and is ending its runs.
            _signal([h], signal.SIGTERM)


def _collect(h: _Helper) -> list[RunRecord]:
    """A helper's records once it exits."""
    code = _reap(h)
    try:
        return [RunRecord.from_doc(d) for d in json.loads(h.out.read_text(encoding="utf-8"))]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        keys = [k for b in h.boxes for k in b.keys]
        return [
            RunRecord(
                run_id="-",
                success=False,
                partitions=[],
                job=BACKFILL_JOB,
                error=(
                    f"run process {h.pid} exited with {code} before reporting"
                    f" ({type(exc).__name__}); its {len(keys)} partition(s) from {keys[0]}"
                    " are planned again by the next `run`"
                ),
                interrupted=code in (-signal.SIGTERM, -signal.SIGINT, 130),
            )
        ]


def _serve(
    settings: Settings, boxes: Sequence[Box], regions: Mapping[str, str | None], out: Path
) -> int:
    """The helper: run its boxes with its own instance, write the records to ``out``."""
    with contextlib.suppress(OSError, AttributeError):  # Linux: stop when the parent dies
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    try:
        defs, inst = build_definitions(settings), instance(settings)
        records = run_boxes(defs, inst, BACKFILL_JOB, boxes, apply_job=APPLY_JOB, regions=regions)
    except KeyboardInterrupt:
        return 130  # stopped before a run started: nothing of ours to report
    tmp = out.with_suffix(".tmp")
    # Metadata values are JSON already (numbers, text); anything else travels as its text.
    tmp.write_text(json.dumps([r.as_doc() for r in records], default=str), encoding="utf-8")
    tmp.replace(out)  # the parent never reads half a document
    return 0
