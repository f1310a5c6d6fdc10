"""Check a big run's partitions in worker processes.

The checks read every row of a partition and recompute its keys: CPU-bound Python, so one
process leaves the other cores idle while a million-post run is checked. A run with at least
``Pooling.min_posts`` posts is cut into chunks of partitions; each worker (``python -m
backfill_assets.ledger.evidence.check_pool``, one per core up to ``_MAX_WORKERS``) takes a
chunk as one JSON line on stdin and answers its check results as one JSON line on stdout,
reading the rows itself (``partition_checks.check_partitions``, the same code the serial path
runs). Check results carry counts and keys, never post text. A chunk whose worker fails is
checked here, serially, so a broken worker costs time, never a check result.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from sqlalchemy.engine import Engine

from backfill_assets.domain.checks.catalog import CheckResult
from backfill_assets.domain.checks.rules import CheckBounds, DriftRule
from backfill_assets.domain.policy.output_gate import OutputContract
from backfill_assets.domain.urls import scrub
from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.dead_peer import DeadPeer
from backfill_assets.ledger.engine import engine_dead_peer, make_engine
from backfill_assets.ledger.evidence.evidence import Partition
from backfill_assets.ledger.evidence.partition_checks import Baseline, CheckSetup, check_partitions
from backfill_assets.ledger.run.partition_counts import held_posts

_MAX_WORKERS = 4


def default_workers() -> int:
    """How many worker processes a big run gets (1: check in this process)."""
    return min(_MAX_WORKERS, os.cpu_count() or 1)


@dataclass(frozen=True)
class Pooling:
    """When and how a check step's partitions go to worker processes."""

    # Below this, starting workers (imports and pandera, ~1.5 s each) costs more than it saves.
    min_posts: int = 40_000
    # Posts per chunk: small enough to balance the workers, big enough that a chunk's fixed
    # cost (one schema frame, one round trip) stays small.
    chunk_posts: int = 20_000
    workers: int = field(default_factory=default_workers)
    # A long check step says how far it got, as the dispatch does.
    progress_every_s: float = 10.0
    command: tuple[str, ...] = (sys.executable, "-m", "backfill_assets.ledger.evidence.check_pool")


def plan(
    partitions: Sequence[Partition],
    counts: Mapping[tuple[str, int], int],
    pooling: Pooling | None = None,
) -> list[list[Partition]] | None:
    """Chunks of partitions for the workers, or None when the run is checked in-process;
    ``counts``: posts per (tenant, slice) of their tenants (``post_counts``)."""
    pooling = pooling or Pooling()
    if pooling.workers < 2 or len(partitions) < 2:
        return None
    sizes = [held_posts(counts, s.tenant_id, s.slices) for s in partitions]
    total = sum(sizes)
    if total < pooling.min_posts:
        return None
    target = max(1, min(pooling.chunk_posts, total // (2 * pooling.workers)))
    chunks: list[list[Partition]] = [[]]
    held = 0
    for part, size in zip(partitions, sizes, strict=True):
        if held >= target:
            chunks.append([])
            held = 0
        chunks[-1].append(part)
        held += size
    return chunks if len(chunks) > 1 else None


def check_chunks(
    engine: Engine,
    chunks: Sequence[Sequence[Partition]],
    setup: CheckSetup,
    log: Callable[[str], None] = lambda _m: None,
    pooling: Pooling | None = None,
) -> dict[str, list[CheckResult]]:
    """Every chunk's check results, from the workers (or from here, for a chunk whose worker failed:
    ``log`` says which worker and why)."""
    pooling = pooling or Pooling()
    versions = setup.versions
    common = {
        "url": engine.url.render_as_string(hide_password=False),
        "dead_peer_s": engine_dead_peer(engine).seconds,
        "versions": [
            versions.task_version,
            versions.key_version,
            versions.model,
            versions.mapping,
        ],
        "contract": {
            "labels": list(setup.contract.labels),
            "none_label": setup.contract.none_label,
            "rules": [list(pair) for pair in setup.contract.rules],
        },
        "bounds": asdict(setup.bounds),
        "names": list(setup.names),
        "sample": setup.sample,
        "stage_share": list(setup.stage_share) if setup.stage_share is not None else None,
    }
    todo: queue.SimpleQueue[Sequence[Partition]] = queue.SimpleQueue()
    for chunk in chunks:
        todo.put(chunk)
    out: dict[str, list[CheckResult]] = {}
    left: list[Partition] = []
    lock = threading.Lock()
    total = sum(len(c) for c in chunks)
    last_log = time.monotonic()

    def drive(proc: subprocess.Popen[str], err: IO[bytes]) -> None:
        nonlocal last_log
        assert proc.stdin is not None and proc.stdout is not None
        while True:
            try:
                chunk = todo.get_nowait()
            except queue.Empty:
                return
            job = dict(common)
            job["partitions"] = [[s.key, s.tenant_id, s.slice, list(s.slices)] for s in chunk]
            job["baselines"] = {
                s.tenant_id: setup.baselines[s.tenant_id]
                for s in chunk
                if s.tenant_id in setup.baselines
            }
            job["deferred"] = {s.key: setup.deferred.get(s.key) for s in chunk}
            job["agreement"] = _agreement_job(setup, chunk)
            try:
                proc.stdin.write(json.dumps(job) + "\n")
                proc.stdin.flush()
                reply = json.loads(proc.stdout.readline() or '{"error": "worker exited"}')
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                got = {
                    k: [_check_result(d) for d in docs]
                    for k, docs in reply["check_results"].items()
                }
            except Exception as exc:
                with lock:
                    left.extend(chunk)
                err.seek(0)
                tail = err.read()[-500:].decode("utf-8", "replace").strip()
                message = (
                    f"WARNING: check worker {proc.pid} failed ({exc})"
                    f"{': ' + tail if tail else ''}; its partitions are checked in this process"
                )
                log(scrub(message, str(common["url"])))  # a driver's error may quote it
                return  # this worker is done for; the others (or this process) take the rest
            with lock:
                out.update(got)
                if time.monotonic() - last_log >= pooling.progress_every_s:
                    last_log = time.monotonic()
                    log(f"checks: {len(out)} of {total} partition(s) checked")

    with contextlib.ExitStack() as stack:
        procs: list[tuple[subprocess.Popen[str], IO[bytes]]] = []
        for _ in range(min(pooling.workers, len(chunks))):
            err: IO[bytes] = stack.enter_context(tempfile.TemporaryFile())
            proc = subprocess.Popen(
                list(pooling.command),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
            stack.callback(_stop, proc)
            procs.append((proc, err))
        threads = [threading.Thread(target=drive, args=pe, daemon=True) for pe in procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    while True:
        try:
            left.extend(todo.get_nowait())
        except queue.Empty:
            break
    if left:
        out.update(check_partitions(engine, left, setup))
    return out


def _agreement_job(
    setup: CheckSetup, chunk: Sequence[Partition]
) -> dict[str, list[list[Any]]] | None:
    """The chunk's tenants' agreement pairs as JSON lists (None: not read)."""
    if setup.agreement is None:
        return None
    return {
        s.tenant_id: [[m, h, n] for (m, h), n in setup.agreement[s.tenant_id].items()]
        for s in chunk
        if s.tenant_id in setup.agreement
    }


def _stop(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _check_result(d: Mapping[str, Any]) -> CheckResult:
    """A check result from its ``asdict`` form after JSON (which turned its tuple into a list)."""
    return CheckResult(**{**d, "sample_keys": tuple(d["sample_keys"])})


def _bounds(d: Mapping[str, Any]) -> CheckBounds:
    drift = d["drift"]
    return CheckBounds(
        max_rebilled_share=float(d["max_rebilled_share"]),
        max_orphan_attempts=int(d["max_orphan_attempts"]),
        max_tokens_per_key=int(d["max_tokens_per_key"]),
        max_over_bound_calls=int(d["max_over_bound_calls"]),
        max_stage_share_drift=float(d["max_stage_share_drift"]),
        min_kappa=float(d["min_kappa"]),
        drift=DriftRule(
            labels=tuple(drift["labels"]),
            factor=float(drift["factor"]),
            min_count=int(drift["min_count"]),
        ),
    )


def _answer(job: Mapping[str, Any], engines: dict[str, Engine]) -> dict[str, Any]:
    url = str(job["url"])
    engine = engines.get(url)
    if engine is None:
        engine = engines[url] = make_engine(url, DeadPeer(float(job["dead_peer_s"])))
    partitions = [
        Partition(str(k), str(t), int(n), tuple(int(x) for x in s))
        for k, t, n, s in job["partitions"]
    ]
    baselines: dict[str, Baseline] = {
        t: (dict(b) if b is not None else None, str(src))
        for t, (b, src) in job["baselines"].items()
    }
    contract = job["contract"]
    setup = CheckSetup(
        versions=Versions(*job["versions"]),
        contract=OutputContract(
            labels=tuple(str(x) for x in contract["labels"]),
            none_label=str(contract["none_label"]),
            rules=tuple((str(r), str(lb)) for r, lb in contract["rules"]),
        ),
        bounds=_bounds(job["bounds"]),
        names=tuple(job["names"]),
        baselines=baselines,
        deferred=dict(job["deferred"]),
        sample=int(job["sample"]),
        stage_share=(str(job["stage_share"][0]), float(job["stage_share"][1]))
        if job.get("stage_share")
        else None,
        agreement=None
        if job.get("agreement") is None
        else {
            str(t): {(str(m), str(h)): int(n) for m, h, n in pairs}
            for t, pairs in job["agreement"].items()
        },
    )
    check_results = check_partitions(engine, partitions, setup)
    return {"check_results": {k: [asdict(v) for v in vs] for k, vs in check_results.items()}}


def serve() -> None:
    """The worker: one job per stdin line, one answer per stdout line, until stdin closes."""
    engines: dict[str, Engine] = {}
    for line in sys.stdin:
        try:
            reply = _answer(json.loads(line), engines)
        except Exception as exc:  # reported to the parent, which checks the chunk itself
            reply = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
