"""Helpers for the checks, apply and operator tests: a small labelled store and tampering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.variables import ChecksSettings
from backfill_assets.definitions import APPLY_JOB, BACKFILL_JOB, build_definitions
from backfill_assets.defs.labels.checks import check_results_for
from backfill_assets.dispatch.pipeline import PartitionRef
from backfill_assets.domain.checks.catalog import CheckResult
from backfill_assets.domain.work.keys import SLICE_KEYS
from backfill_assets.runner.orchestrate import materialize
from backfill_assets.runner.run_records import RunRecord
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import RUBRIC, VERSIONS

TEXTS = {
    "ok": "Thanks for the write-up, it fixed my build.",
    "spam": "BUY NOW limited offer http://cheap-watch.xyz",
    "abuse": "You are an idiot and everyone knows it.",
}


def records(tenant: str, n: int, spam_every: int = 0) -> list[dict[str, str]]:
    """``n`` posts of a tenant; every ``spam_every``-th one is spam (0: none), a few abuse."""
    out = []
    for i in range(n):
        kind = "spam" if spam_every and i % spam_every == 0 else "abuse" if i % 17 == 5 else "ok"
        out.append({"tenant_id": tenant, "post_id": f"p{i:04d}", "text": f"{TEXTS[kind]} #{i}"})
    return out


def load(engine: Engine, tmp_path: Path, tenants: dict[str, int], spam_every: int = 0) -> None:
    """Import ``{tenant: number of posts}``."""
    recs = [r for t, n in tenants.items() for r in records(t, n, spam_every)]
    import_records(engine, tmp_path, recs, name=f"export-{len(recs)}.jsonl")


def run_job(
    store_url: str,
    instance: dg.DagsterInstance,
    tenants: list[str],
    slices: list[str] | None = None,
    **env: str,
) -> list[RunRecord]:
    """The CLI's path: labels, checks and the gated apply, then the per-partition follow-up."""
    defs = build_definitions({"BACKFILL_DATABASE_URL": store_url, **env})
    return materialize(
        defs,
        instance,
        BACKFILL_JOB,
        tenants,
        slices or list(SLICE_KEYS),
        log_level="CRITICAL",
        apply_job=APPLY_JOB,
    )


def busiest(engine: Engine, tenant: str) -> PartitionRef:
    """The tenant's partition with the most posts (tampering needs a few rows)."""
    with engine.connect() as conn:
        slice_no = conn.execute(
            sa.text(
                "SELECT slice FROM posts WHERE tenant_id = :t GROUP BY slice"
                " ORDER BY count(*) DESC, slice LIMIT 1"
            ),
            {"t": tenant},
        ).scalar_one()
    return PartitionRef(key=f"s{slice_no:02d}|{tenant}", tenant_id=tenant, slice=int(slice_no))


def check_results(engine: Engine, ref: PartitionRef, **policy: Any) -> dict[str, CheckResult]:
    """Every check's check result for one partition, by name."""
    found = check_results_for(engine, ref, VERSIONS, RUBRIC, ChecksSettings(**policy))
    return {v.name: v for v in found}


def execute(engine: Engine, sql: str, **params: Any) -> Any:
    """Run one statement in its own transaction (the tampering)."""
    with engine.begin() as conn:
        return conn.execute(sa.text(sql), params)


def one_key(engine: Engine, ref: PartitionRef, table: str = "results") -> str:
    """Some key of a partition's rows."""
    with engine.connect() as conn:
        key: str = (
            conn.execute(
                sa.text(
                    f"SELECT key FROM {table} WHERE tenant_id = :t AND slice = :s ORDER BY key"
                ),
                {"t": ref.tenant_id, "s": ref.slice},
            )
            .scalars()
            .first()
        )
    return key


def dump_posts(engine: Engine) -> list[tuple[Any, ...]]:
    """Every column of every post, in key order (byte-identity of the posts table)."""
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(sa.text("SELECT * FROM posts ORDER BY tenant_id, post_id"))
        ]
