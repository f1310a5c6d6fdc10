"""``tenant set-region TENANT REGION`` and ``tenant list``: where each tenant's work may go."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from backfill_assets.cli.commands import emit
from backfill_assets.cli.inputs import UserError, known_tenants
from backfill_assets.cli.tables import table
from backfill_assets.core.regions import InvalidRegion, base_url_var, validate_region
from backfill_assets.orchestration.resources import OpenAIModelResource
from backfill_assets.orchestration.settings import Settings
from backfill_assets.store.engine import read_tx, write_tx
from backfill_assets.store.reports import tenant_ids
from backfill_assets.store.tenants import set_region, tenant_rows

TENANT_COLUMNS = ["tenant", "region", "posts", "done", "billed"]


def add_tenant_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register the ``tenant`` group: ``set-region`` and ``list``."""
    group = add("tenant", "Tenants' regions (data residency): set-region, list.")
    sub = group.add_subparsers(dest="tenant_command", required=True, metavar="SUBCOMMAND")

    def child(name: str, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        # SUPPRESS: a --json given before the subcommand (``tenant --json list``) still counts.
        sp.add_argument(
            "--json",
            action="store_true",
            default=argparse.SUPPRESS,
            help="print JSON instead of a table",
        )
        return sp

    sp = child(
        "set-region",
        "Set the region whose endpoint (BACKFILL_MODEL_BASE_URL__<REGION>) serves a tenant.",
    )
    sp.add_argument("tenant", help="tenant id")
    sp.add_argument("region", help="region name, ^[a-z][a-z0-9-]{1,19}$ (e.g. eu, us-east)")
    sp.set_defaults(func=cmd_set_region)

    sp = child("list", "Tenants with their region, posts, done (current versions) and billed.")
    sp.set_defaults(func=cmd_tenant_list)


def cmd_set_region(args: argparse.Namespace, settings: Settings) -> int:
    """Set a tenant's region; exit 2 for a malformed region or an unknown tenant."""
    try:
        region = validate_region(args.region)
    except InvalidRegion as exc:
        raise UserError(f"argument REGION: {exc}") from None
    engine = settings.store_engine()
    with read_tx(engine) as conn:
        tenant = known_tenants([args.tenant], tenant_ids(conn), flag="TENANT")[0]
    with write_tx(engine) as conn:
        previous = set_region(conn, tenant, region)
    doc = {"tenant": tenant, "region": region, "previous": previous}
    emit(args, doc, f"{tenant}: region {region} (was {previous or 'none: default endpoint'})")
    model = settings.model_resource()
    if isinstance(model, OpenAIModelResource) and region not in model.region_base_urls:
        # Not an error: endpoints belong to the process that dispatches, maybe not this one.
        print(
            f"note: {base_url_var(region)} is not set here; a run in this environment sends "
            f"nothing for {tenant} and fails its partitions",
            file=sys.stderr,
            flush=True,
        )
    return 0


def cmd_tenant_list(args: argparse.Namespace, settings: Settings) -> int:
    """Every tenant's region, posts, done keys (current versions) and billed tokens."""
    engine = settings.store_engine()
    with read_tx(engine) as conn:
        rows = tenant_rows(conn, settings.versions())
    emit(args, {"tenants": rows}, table(rows, TENANT_COLUMNS))
    return 0
