"""The CLI commands. Each takes parsed args and the environment and returns an exit code."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa

from ..definitions import APPLY_JOB, BACKFILL_JOB, build_definitions
from ..demo.generate import write_export
from ..importer import import_jsonl
from ..keys import SLICE_COUNT, SLICE_KEYS, InvalidTenantId, validate_tenant_id
from ..orchestrate import ensure_tenant_partitions, materialize
from ..resources import engine_for
from ..rubric import MAX_OUTPUT_TOKENS, estimate_prompt_tokens
from ..settings import (
    PROJECT_ROOT,
    dagster_home,
    database_url,
    settings_from_env,
    versions_from_env,
)
from ..store.audit import verify_store
from ..store.engine import read_tx, write_tx
from ..store.migrate import migrate
from ..store.reports import tenant_ids, usage_by_day, usage_by_tenant_model
from ..store.tables import dead_letters
from ..store.work import pending_query
from ..usage import USAGE_COLUMNS, usage_csv
from .format import table
from .run_report import HUMAN_COLUMNS, human_rows, run_document

Env = dict[str, str]


class UserError(ValueError):
    """Bad input from the command line."""


def _emit(args: argparse.Namespace, doc: Any, human: str) -> None:
    print(json.dumps(doc, sort_keys=True, default=str) if args.json else human, flush=True)


def _instance(env: Env) -> dg.DagsterInstance:
    home = dagster_home(env)
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copyfile(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    return dg.DagsterInstance.from_config(str(home))


def _tenants(values: list[str]) -> list[str]:
    try:
        return [validate_tenant_id(t) for t in values]
    except InvalidTenantId as exc:
        raise UserError(str(exc)) from None


def _slices(values: list[str]) -> list[str]:
    out = []
    for v in values:
        key = f"s{int(v):02d}" if v.isdigit() else v
        if key not in SLICE_KEYS:
            raise UserError(
                f"unknown slice {v!r}: expected s00..s{SLICE_COUNT - 1:02d} or 0..{SLICE_COUNT - 1}"
            )
        out.append(key)
    return out


def cmd_import(args: argparse.Namespace, env: Env) -> int:
    """Import a JSONL export and register new tenants as partitions."""
    path = Path(args.path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    engine = engine_for(database_url(env))
    summary = import_jsonl(
        engine, path, progress=lambda s: print(f"... {s.read} lines", file=sys.stderr, flush=True)
    )
    with read_tx(engine) as conn:
        all_tenants = tenant_ids(conn)
    ensure_tenant_partitions(_instance(env), all_tenants)
    doc = summary.as_dict()
    if not args.json and summary.rejected:
        print(f"{summary.rejected} line(s) rejected; see table rejected_records", file=sys.stderr)
    print(json.dumps(doc, sort_keys=True), flush=True)
    return 0


def cmd_run(args: argparse.Namespace, env: Env) -> int:
    """Materialise labels, checks and the gated apply in-process; exit 1 if a check blocked."""
    engine = engine_for(database_url(env))
    with read_tx(engine) as conn:
        known = tenant_ids(conn)
    tenants = _tenants(args.tenant) or known
    unknown = sorted(set(tenants) - set(known))
    if unknown:
        raise UserError(f"unknown tenant(s): {', '.join(unknown)} (import their posts first)")
    slices = _slices(args.slice) or list(SLICE_KEYS)
    records = materialize(
        build_definitions(env), _instance(env), BACKFILL_JOB, tenants, slices, apply_job=APPLY_JOB
    )
    doc = run_document(records)
    human = table(human_rows(doc), HUMAN_COLUMNS)
    failed = [r for r in doc["runs"] if not r["success"]]
    human += "\n" + json.dumps({"totals": doc["totals"], "failed_runs": len(failed)})
    for r in failed:
        human += f"\nrun {r['run_id']} ({r['job']}) failed: {r['error']}"
    if doc["blocked_partitions"]:
        human += "\nblocking checks failed; see `backfill-moderation check --tenant T --slice S`"
    _emit(args, doc, human)
    return 0 if doc["ok"] else 1


def cmd_verify(args: argparse.Namespace, env: Env) -> int:
    """Audit the store; exit 1 on isolation/duplicate problems (or missing keys if required)."""
    engine = engine_for(database_url(env))
    outcome = verify_store(engine, versions_from_env(env), _tenants(args.tenant) or None)
    doc = outcome.as_dict(require_complete=args.require_complete)
    human = table(
        doc["tenants"],
        [
            "tenant",
            "expected",
            "done",
            "dead",
            "missing",
            "billed_tokens",
            "rebilled_tokens",
            "orphan_attempts",
        ],
    )
    for p in doc["problems"][:50]:
        human += (
            f"\n{p['kind']}: tenant={p['tenant']} table={p['table']}"
            f" key={p['key'][:16]} {p['detail']}"
        )
    human += f"\n{'OK' if doc['ok'] else 'FAILED'}"
    _emit(args, doc, human)
    return 0 if doc["ok"] else 1


def cmd_usage(args: argparse.Namespace, env: Env) -> int:
    """Tokens, cost and calls per tenant, model and day (or per tenant and model)."""
    engine = engine_for(database_url(env))
    with read_tx(engine) as conn:
        rows = usage_by_tenant_model(conn) if args.totals else usage_by_day(conn)
    cols = [c for c in USAGE_COLUMNS if not (args.totals and c == "day")]
    if args.csv:
        print(usage_csv(rows, cols), end="", flush=True)
        return 0
    _emit(args, {"usage": rows}, table(rows, cols))
    return 0


def cmd_dry_run(args: argparse.Namespace, env: Env) -> int:
    """Pending keys and estimated tokens per tenant, without calling the model."""
    engine = engine_for(database_url(env))
    versions = versions_from_env(env)
    rubric = settings_from_env(env).rubric()
    out = []
    with read_tx(engine) as conn:
        tenants = _tenants(args.tenant) or tenant_ids(conn)
        for tenant in tenants:
            keys = tokens = 0
            for s in range(SLICE_COUNT):
                for row in conn.execute(pending_query(tenant, s, versions)):
                    keys += 1
                    tokens += estimate_prompt_tokens(rubric, row.text) + MAX_OUTPUT_TOKENS
            out.append({"tenant": tenant, "keys": keys, "estimated_tokens": tokens})
    doc = {"versions": versions.code_version, "tenants": out}
    _emit(
        args, doc, table(out, ["tenant", "keys", "estimated_tokens"]) + f"\n{versions.code_version}"
    )
    return 0


def cmd_requeue(args: argparse.Namespace, env: Env) -> int:
    """Delete dead letters so those keys are sent again on the next run."""
    tenant = _tenants([args.tenant])[0]
    engine = engine_for(database_url(env))
    with write_tx(engine) as conn:
        n = conn.execute(
            dead_letters.delete().where(
                dead_letters.c.tenant_id == tenant, dead_letters.c.outcome == args.outcome
            )
        ).rowcount
    doc = {"tenant": tenant, "outcome": args.outcome, "requeued": int(n or 0)}
    _emit(args, doc, f"requeued {doc['requeued']} {args.outcome} key(s) of {tenant}")
    return 0


def cmd_migrate(args: argparse.Namespace, env: Env) -> int:
    """Apply migrations."""
    engine = engine_for(database_url(env))
    with read_tx(engine) as conn:
        versions = [
            int(v) for v in conn.execute(sa.text("SELECT version FROM schema_migrations")).scalars()
        ]
    applied = migrate(engine)
    _emit(
        args,
        {"applied": applied, "current": sorted(versions)},
        f"schema at {max(versions, default=0)}",
    )
    return 0


def cmd_demo_data(args: argparse.Namespace, env: Env) -> int:
    """Write a synthetic export."""
    tenants = ["acme", "globex", "initech", "umbrella", "hooli", "wayne", "stark", "tyrell"]
    while len(tenants) < args.tenants:
        tenants.append(f"tenant-{len(tenants):04d}")
    n = write_export(
        Path(args.out), tenants[: args.tenants], args.posts, bad_lines=not args.no_bad_lines
    )
    _emit(args, {"path": args.out, "lines": n}, f"wrote {n} lines to {args.out}")
    return 0
