"""``tenant set-region``, ``tenant set-budget`` and ``tenant list``: where each tenant's work
may go, and how much it may spend."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from backfill_assets.cli.inputs import known_tenants
from backfill_assets.cli.numbers import token_cap, usd_cap
from backfill_assets.cli.parsers import command_group
from backfill_assets.cli.tables import emit, table, tell
from backfill_assets.domain.errors import UserError
from backfill_assets.domain.work import InvalidRegion, base_url_var, validate_region

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings

TENANT_COLUMNS = [
    "tenant",
    "region",
    "posts",
    "done",
    "billed",
    "billed_usd",
    "budget_tokens",
    "budget_usd",
]


def add_tenant_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register the ``tenant`` group: ``set-region``, ``set-budget`` and ``list``."""
    child = command_group(
        add,
        "tenant",
        "Tenants' regions and budgets: set-region, set-budget, list.",
        "tenant_command",
    )

    sp = child(
        "set-region",
        "Set the region whose endpoint (BACKFILL_MODEL_BASE_URL__<REGION>) serves a tenant.",
    )
    sp.add_argument("tenant", help="tenant id")
    sp.add_argument("region", help="region name, ^[a-z][a-z0-9-]{1,19}$ (e.g. eu, us-east)")
    sp.set_defaults(func=cmd_set_region)

    sp = child(
        "set-budget",
        "Cap what a tenant may spend, in dollars and/or tokens, over all its runs: strict, "
        "by reservation (a call reserves the most it can cost before it is sent).",
    )
    sp.add_argument("tenant", help="tenant id")
    sp.add_argument(
        "--usd",
        type=usd_cap,
        metavar="AMOUNT",
        help="dollar cap, e.g. 50 or 12.50 (up to 9 decimals, at most 1,000,000,000); "
        "'none' removes it",
    )
    sp.add_argument(
        "--tokens",
        type=token_cap,
        metavar="N",
        help="token cap, 0 to 10^18 (instead of BACKFILL_TENANT_BUDGET_TOKENS for this "
        "tenant); 'none' removes it",
    )
    sp.set_defaults(func=cmd_set_budget)

    sp = child(
        "list", "Tenants with their region, posts, done (current versions), billed and budgets."
    )
    sp.set_defaults(func=cmd_tenant_list)


def cmd_set_region(args: argparse.Namespace, settings: Settings) -> int:
    """Set a tenant's region; exit 2 for a malformed region or an unknown tenant."""
    from backfill_assets.runner.queries import (
        read_tx,
        set_region,
        store_engine,
        tenant_ids,
        write_tx,
    )

    try:
        region = validate_region(args.region)
    except InvalidRegion as exc:
        raise UserError(f"argument REGION: {exc}") from None
    engine = store_engine(settings.store)
    with read_tx(engine) as conn:
        tenant = known_tenants([args.tenant], tenant_ids(conn), flag="TENANT")[0]
    with write_tx(engine) as conn:
        previous = set_region(conn, tenant, region)
    doc = {"tenant": tenant, "region": region, "previous": previous}
    emit(args, doc, f"{tenant}: region {region} (was {previous or 'none: default endpoint'})")
    # The model resource brings Dagster and the provider stack: only for this note.
    from backfill_assets.runner.api import OpenAIModelResource, model_resource

    model = model_resource(settings)
    if isinstance(model, OpenAIModelResource) and region not in model.region_base_urls:
        # Not an error: endpoints belong to the process that dispatches, maybe not this one.
        tell(
            f"note: {base_url_var(region)} is not set here; a run in this environment sends "
            f"nothing for {tenant} and fails its partitions"
        )
    return 0


def cmd_set_budget(args: argparse.Namespace, settings: Settings) -> int:
    """Set or remove a tenant's dollar and token caps; exit 2 for bad amounts or tenants."""
    from backfill_assets.runner.queries import (
        budget_status,
        read_tx,
        set_caps,
        store_engine,
        tenant_caps,
        tenant_ids,
        write_tx,
    )

    # Only the units given change; the other keeps its cap.
    given: dict[str, int | None] = {}
    if args.usd is not None:
        given["nanos"] = args.usd.value
    if args.tokens is not None:
        given["tokens"] = args.tokens.value
    if not given:
        raise UserError("give --usd AMOUNT and/or --tokens N (or 'none' to remove a cap)")
    engine = store_engine(settings.store)
    with read_tx(engine) as conn:
        tenant = known_tenants([args.tenant], tenant_ids(conn), flag="TENANT")[0]
    default_tokens = settings.run.tenant_budget_tokens or None
    with write_tx(engine) as conn:
        set_caps(conn, tenant, dataclasses.replace(tenant_caps(conn, tenant, None), **given))
        status = budget_status(conn, tenant, default_tokens)
    doc = {"tenant": tenant, **status.as_dict()}
    emit(args, doc, _budget_text(doc))
    return 0


def _budget_text(doc: dict[str, object]) -> str:
    usd_part = (
        "no dollar cap"
        if doc["budget_usd"] is None
        else f"${doc['budget_usd']} cap, ${doc['free_usd']} free"
    )
    token_part = (
        "no token cap"
        if doc["budget_tokens"] is None
        else f"{doc['budget_tokens']} token cap, {doc['free_tokens']} free"
    )
    return (
        f"{doc['tenant']}: {usd_part}; {token_part} "
        f"(billed ${doc['billed_usd']} and {doc['billed_tokens']} tokens, "
        f"reserved by runs in flight ${doc['reserved_usd']} and {doc['reserved_tokens']} tokens)"
    )


def cmd_tenant_list(args: argparse.Namespace, settings: Settings) -> int:
    """Every tenant's region, posts, done keys (current versions) and billed tokens."""
    from backfill_assets.runner.queries import read_tx, store_engine, tenant_rows

    engine = store_engine(settings.store)
    with read_tx(engine) as conn:
        rows = tenant_rows(conn, settings.versions())
    emit(args, {"tenants": rows}, table(rows, TENANT_COLUMNS))
    return 0
