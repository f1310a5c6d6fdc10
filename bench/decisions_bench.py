"""Moderators' decisions at scale: ``decisions import`` of one decision per post over a store
of posts that all hold a model label, on PostgreSQL.

    bench/run decisions [--posts 1000000] [--tenants 200]

The store is filled directly (COPY): ``--posts`` posts over ``--tenants`` tenants, each with a
model label in ``applied_labels`` under the built-in policy, as a run would leave them. Then a
JSONL file of one decision per post is imported (every decision new, each applied over the
model's label), and imported again (every decision unchanged, every post re-applied and found
holding it already). Figures: wall, CPU and peak RSS of each ``decisions import`` command in
its own process, and decisions per second. ``uptime`` is printed first: the machine is shared.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from backfill_assets.domain.policy.file import builtin_policy
from backfill_assets.domain.work.keys import content_hash, slice_of
from backfill_assets.ledger.bulk import insert_rows
from backfill_assets.ledger.engines import engine_for
from backfill_assets.ledger.policies import register_policy
from backfill_assets.ledger.tables import applied_labels, posts, tenants, utcnow
from bench.common import drop_store, machine_speed, new_store
from bench.scale_bench import Measured, cli, cli_env

PREFIX = "bf_bench_decisions_"
_CHUNK = 50_000
_LABELS = ("spam", "abuse", "needs_review", "ok")
_BASE = dt.datetime(2026, 11, 1, 0, 0, 0)


def _keys(n: int, tenant_count: int) -> Iterator[tuple[str, str]]:
    for i in range(n):
        yield f"t{i % tenant_count:04d}", f"p{i:08d}"


def fill_store(url: str, n: int, tenant_count: int) -> None:
    """``n`` posts, each with the model's label in force, written with COPY."""
    engine = engine_for(url)
    policy = builtin_policy()
    register_policy(engine, policy)
    now = utcnow()
    with engine.begin() as conn:
        rows = [
            {
                "tenant_id": f"t{t:04d}",
                "billed_tokens": 0,
                "billed_nanos": 0,
                "created_at": now,
                "slice_level": 0,
            }
            for t in range(tenant_count)
        ]
        insert_rows(conn, tenants, list(rows[0]), rows)
    chunk_posts: list[dict[str, Any]] = []
    chunk_labels: list[dict[str, Any]] = []

    def flush() -> None:
        with engine.begin() as conn:
            insert_rows(conn, posts, list(chunk_posts[0]), chunk_posts)
            insert_rows(conn, applied_labels, list(chunk_labels[0]), chunk_labels)
        chunk_posts.clear()
        chunk_labels.clear()

    for i, (tenant, post) in enumerate(_keys(n, tenant_count)):
        text = f"post {i} of {tenant}: nothing to see here"
        digest = content_hash(text)
        chunk_posts.append(
            {
                "tenant_id": tenant,
                "post_id": post,
                "text": text,
                "content_hash": digest,
                "slice": slice_of(tenant, post),
                "imported_at": now,
                "updated_at": now,
            }
        )
        chunk_labels.append(
            {
                "tenant_id": tenant,
                "post_id": post,
                "policy_id": policy.policy_id,
                "label": "ok",
                "rule_ids": "",
                "policy_version": policy.version,
                "key_version": policy.key_version,
                "model": "fake-moderator-1",
                "result_key": f"k{i:08d}",
                "content_hash": digest,
                "applied_at": now,
                "source": "model",
            }
        )
        if len(chunk_posts) >= _CHUNK:
            flush()
    if chunk_posts:
        flush()
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE posts"))
        conn.execute(sa.text("ANALYZE applied_labels"))


def write_decisions(path: Path, n: int, tenant_count: int) -> Path:
    """One decision per post under the built-in policy, labels in turn, opaque reviewers."""
    policy = builtin_policy()
    with path.open("w", encoding="utf-8") as fh:
        for i, (tenant, post) in enumerate(_keys(n, tenant_count)):
            row = {
                "tenant_id": tenant,
                "post_id": post,
                "policy_id": policy.policy_id,
                "policy_version": policy.version,
                "label": _LABELS[i % len(_LABELS)],
                "rule_ids": [],
                "reviewer_id": f"mod-{i % 50}",
                "decided_at": (_BASE + dt.timedelta(seconds=i)).isoformat() + "Z",
                "reason_code": f"R-{i % 7}",
            }
            fh.write(json.dumps(row) + "\n")
    return path


def _report(name: str, m: Measured, n: int) -> None:
    rate = n / m.wall if m.wall else 0.0
    print(
        f"[{name}] {m.wall:,.1f} s wall, {m.cpu:,.1f} s CPU, peak RSS {m.rss_mb:,.0f} MB, "
        f"{rate:,.0f} decisions/s; {json.dumps(m.doc, sort_keys=True)}",
        flush=True,
    )


def decisions_bench(n: int, tenant_count: int) -> dict[str, Any]:
    """Fill, import, import again; the figures of both imports."""
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(machine_speed(), flush=True)
    with tempfile.TemporaryDirectory(prefix="decisions-bench-") as tmp:
        work = Path(tmp)
        url = new_store("pg", work, prefix=PREFIX)
        try:
            fill_store(url, n, tenant_count)
            path = write_decisions(work / "decisions.jsonl", n, tenant_count)
            size = path.stat().st_size / 2**20
            print(
                f"# {n:,} posts over {tenant_count} tenants, each labelled; {size:,.0f} MiB of decisions"
            )
            env = cli_env(work / "home", url)
            first = cli(["decisions", "import", str(path)], env)
            _report("decisions import (all new)", first, n)
            assert first.doc["imported"] == n and first.doc["applied"] == n, first.doc
            again = cli(["decisions", "import", str(path)], env)
            _report("decisions import again (unchanged, re-applied)", again, n)
            assert again.doc["unchanged"] == n and again.doc["already_applied"] == n, again.doc
            with sa.create_engine(url).connect() as conn:
                human = conn.execute(
                    sa.text("SELECT count(*) FROM applied_labels WHERE source = 'human'")
                ).scalar_one()
            assert human == n, human
        finally:
            drop_store(url)
    return {
        "posts": n,
        "import_s": first.wall,
        "import_rss_mb": first.rss_mb,
        "reimport_s": again.wall,
        "reimport_rss_mb": again.rss_mb,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--posts", type=int, default=1_000_000, help="posts, one decision each")
    p.add_argument("--tenants", type=int, default=200, help="tenants the posts are spread over")
    a = p.parse_args()
    print(json.dumps(decisions_bench(a.posts, a.tenants)))


if __name__ == "__main__":
    main()
