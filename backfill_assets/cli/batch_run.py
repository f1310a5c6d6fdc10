"""A batch-mode run of whole tenants without Dagster (crash drills, benchmarks, operators).

    python -m backfill_assets.cli.batch_run [--tenant T]...

Reads the same environment as the CLI (``BACKFILL_DATABASE_URL``, ``BACKFILL_MODEL_*``,
``BACKFILL_BATCH_*``, ``BACKFILL_KILL_AT``) and runs ``pipeline.run_partitions`` in batch mode
with the same writer locks, ledger and outcomes as a Dagster run; only the orchestration (run
records, checks, the apply) is left out. Prints one JSON line: totals over the partitions
and chunks per state. Exit 1 if the run was stopped by a run-level refusal (401, 403, 404:
the message names the status and endpoint), a chunk failed (the provider refused it; the log
has its errors) or a partition was busy, 2 on bad settings.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections import Counter
from collections.abc import Sequence

from backfill_assets.cli.inputs import known_tenants
from backfill_assets.cli.tables import show_json, tell
from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.domain.work import SLICE_KEYS
from backfill_assets.runner.api import (
    PartitionRef,
    RunResource,
    RunStopped,
    model_resource,
    partition_key_for,
    run_partitions,
    versions_for,
)
from backfill_assets.runner.queries import (
    ChunkState,
    read_tx,
    state_counts,
    store_engine,
    tenant_ids,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run; exit 2 on bad settings."""
    parser = argparse.ArgumentParser(prog="python -m backfill_assets.cli.batch_run")
    parser.add_argument("--tenant", action="append", default=[], help="tenant id (repeatable)")
    args = parser.parse_args(argv)
    try:
        env = Settings.from_env({**os.environ, "BACKFILL_DISPATCH": "batch"})
        env.require_price()
        settings, model = RunResource.of(env), model_resource(env)
        faults, engine = env.drills.faults(), store_engine(env.store)
        with read_tx(engine) as conn:
            known = tenant_ids(conn)
        tenants = known_tenants(args.tenant, known) or known
    except (SettingsError, ValueError) as exc:  # UserError too: an unknown --tenant
        tell(f"error: {exc}")
        return 2
    refs = [
        PartitionRef(partition_key_for(t, s), t, i)
        for t in tenants
        for i, s in enumerate(SLICE_KEYS)
    ]
    run_id = f"batch-{uuid.uuid4().hex[:12]}"
    stopped: RunStopped | None = None
    try:
        reports = run_partitions(
            engine,
            refs,
            model.build_adapter,
            versions_for(model, env.rubric()),
            env.rubric(),
            run_id,
            settings.run_options(model, faults),
            log=tell,
        )
    except RunStopped as exc:
        # A run-level refusal (401/403/404 ...): every chunk stays for the next run.
        stopped, reports = exc, exc.reports
        tell(f"error: {exc}")
    totals: Counter[str] = Counter()
    for rep in reports:
        for name, value in rep.summary().items():
            if isinstance(value, int) and not isinstance(value, bool):
                totals[name] += value
        for outcome, n in rep.stats.outcomes.items():
            totals[f"outcome_{outcome}"] += n
        totals["cost_nanos"] += rep.stats.cost_nanos
    with read_tx(engine) as conn:
        chunks = state_counts(conn, tenants)
        failed = state_counts(conn, tenants, run_id).get(ChunkState.FAILED, 0)
    busy = [r.ref.key for r in reports if r.busy]
    doc = {
        "totals": dict(totals),
        "chunks": chunks,
        "failed_this_run": failed,
        "busy": busy,
        "stopped": str(stopped) if stopped else None,
    }
    show_json(doc)
    # Stopped by a run-level refusal, chunks the provider refused (see the log for their
    # errors) or partitions left to others.
    return 1 if stopped or failed or busy else 0


if __name__ == "__main__":
    sys.exit(main())
