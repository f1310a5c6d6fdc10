"""A cascade's routes through its stages, read from stored results (issue 49).

Each stage's calls are ordinary work under the stage's own versions: keys, attempts, usage,
results and dead letters as for one model. Which posts reach a stage, and which stage decides a
post, is worked out here from what is stored, never remembered by a run: a crash between two
stages, a rerun or a changed ``decide`` rule all read the same tables and agree.

A post reaches stage k+1 when stage k answered it and its rule does not decide it, or stage k
could not read or was refused it (a final dead letter: ``schema_rejected``,
``transport_rejected``). A post whose stage k has no answer yet (pending, or ``retry_exhausted``
to be retried) goes no further. The labels the cascade decides are rows of ``results`` under
the cascade's versions (model ``cascade``, ``stage`` the stage that decided), composed from the
deciding stage's result without a call; dead letters of the last stage (and retry_exhausted
ones of any stage, until retried) become the cascade's, so coverage holds as for one model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backfill_assets.domain.cascade import Decide, decides, stage_score
from backfill_assets.domain.work.keys import Versions, work_key
from backfill_assets.ledger.run.work import FINAL_DEAD_OUTCOMES
from backfill_assets.ledger.tables import applied_labels, dead_letters, posts, results, utcnow

Post = tuple[str, str]  # (post_id, content_hash)
_COMPARED = ("label", "rule_ids", "confidence", "p_label", "mapping", "stage")


@dataclass(frozen=True, slots=True)
class RouteStage:
    """What routing needs of a stage: its versions, its rule, its dialect and its name."""

    name: str
    versions: Versions
    decide: Decide | None
    dialect: str


@dataclass
class Routes:
    """One partition's routes: the posts that reach each stage, and what composing changed."""

    reach: list[set[Post]] = field(default_factory=list)
    decided_by: dict[str, int] = field(default_factory=dict)
    # Stored labels changed or withdrawn by a changed rule (re-routed without a call).
    rerouted: int = 0


def _same(table: sa.Table, tenant_id: str, slices: Sequence[int], v: Versions) -> list[Any]:
    c = table.c
    return [
        c.tenant_id == tenant_id,
        c.slice.in_(list(slices)),
        c.task_version == v.task_version,
        c.key_version == v.key_version,
        c.model == v.model,
    ]


def route_partition(
    conn: Connection,
    tenant_id: str,
    slices: Sequence[int],
    stages: Sequence[RouteStage],
    labels: Versions,
    none_label: str,
    run_id: str | None = None,
) -> Routes:
    """Read the partition's stage results and work out each post's route; with ``run_id``,
    also write the cascade's labels and dead letters where they differ from what is stored
    (the caller holds the partition's writer lock and the transaction)."""
    current: dict[str, tuple[str, int]] = {
        str(p): (str(h), int(s))
        for p, h, s in conn.execute(
            sa.select(posts.c.post_id, posts.c.content_hash, posts.c.slice).where(
                posts.c.tenant_id == tenant_id, posts.c.slice.in_(list(slices))
            )
        )
    }
    answers: list[dict[str, Any]] = []
    dead: list[dict[str, tuple[str, str, int]]] = []
    for st in stages:
        r = results.c
        rows = conn.execute(
            sa.select(
                r.post_id, r.content_hash, r.label, r.rule_ids, r.confidence, r.p_label
            ).where(*_same(results, tenant_id, slices, st.versions))
        )
        answers.append({str(x[0]): x for x in rows if current.get(str(x[0]), ("",))[0] == x[1]})
        d = dead_letters.c
        drows = conn.execute(
            sa.select(d.post_id, d.content_hash, d.outcome, d.reason, d.attempts).where(
                *_same(dead_letters, tenant_id, slices, st.versions)
            )
        )
        dead.append(
            {
                str(x[0]): (str(x[2]), str(x[3]), int(x[4]))
                for x in drows
                if current.get(str(x[0]), ("",))[0] == x[1]
            }
        )
    routes = Routes(reach=[set() for _ in stages])
    want: dict[str, dict[str, Any]] = {}
    want_dead: dict[str, dict[str, Any]] = {}
    last = len(stages) - 1
    for post_id, (chash, slice_no) in current.items():
        key = work_key(labels, tenant_id, post_id, chash)
        base = {"key": key, "post_id": post_id, "content_hash": chash, "slice": slice_no}
        for k, st in enumerate(stages):
            routes.reach[k].add((post_id, chash))
            got = answers[k].get(post_id)
            if got is not None:
                score = stage_score(st.dialect, got[5], float(got[4]))
                if k == last or decides(st.decide, str(got[2]), score, none_label):
                    want[key] = {
                        **base,
                        "label": str(got[2]),
                        "rule_ids": str(got[3]),
                        "confidence": float(got[4]),
                        "p_label": got[5],
                        "mapping": labels.mapping,
                        "stage": st.name,
                    }
                    routes.decided_by[st.name] = routes.decided_by.get(st.name, 0) + 1
                    break
                continue
            failed = dead[k].get(post_id)
            if failed is not None and failed[0] in FINAL_DEAD_OUTCOMES and k < last:
                continue  # the stage could not decide it: the next one is asked
            if failed is not None:
                want_dead[key] = {
                    **base,
                    "outcome": failed[0],
                    "reason": f"stage {st.name}: {failed[1]}"[:2000],
                    "attempts": failed[2],
                }
            break
    if run_id is not None:
        _write(conn, tenant_id, slices, labels, current, want, want_dead, run_id, routes)
    return routes


def _write(
    conn: Connection,
    tenant_id: str,
    slices: Sequence[int],
    labels: Versions,
    current: dict[str, tuple[str, int]],
    want: dict[str, dict[str, Any]],
    want_dead: dict[str, dict[str, Any]],
    run_id: str,
    routes: Routes,
) -> None:
    """Make the cascade's stored labels and dead letters of current texts what ``want`` says."""
    r = results.c
    have = {
        str(x[0]): x
        for x in conn.execute(
            sa.select(r.key, r.post_id, r.content_hash, *(r[c] for c in _COMPARED)).where(
                *_same(results, tenant_id, slices, labels)
            )
        )
        if current.get(str(x[1]), ("",))[0] == x[2]
    }
    now = utcnow()
    common = {
        "tenant_id": tenant_id,
        "model": labels.model,
        "key_version": labels.key_version,
        "task_version": labels.task_version,
        "run_id": run_id,
    }
    inserts = [{**common, **row, "created_at": now} for k, row in want.items() if k not in have]
    updates = [
        {"k": k, **{c: row[c] for c in _COMPARED}}
        for k, row in want.items()
        if k in have and tuple(have[k][3:]) != tuple(row[c] for c in _COMPARED)
    ]
    gone = [k for k in have if k not in want]
    if inserts:
        conn.execute(results.insert(), inserts)
    if updates:
        conn.execute(
            results.update()
            .where(r.key == sa.bindparam("k"))
            .values({c: sa.bindparam(c) for c in _COMPARED}),
            updates,
        )
    # A label re-routed to another answer reaches the posts and the sink again (as
    # ``relabel.py`` does); a row that only records the new rules' version is not news.
    moved = [
        {"k": u["k"]}
        for u in updates
        if _answer(u) != _answer(dict(zip(_COMPARED, have[u["k"]][3:], strict=True)))
    ]
    if moved:
        conn.execute(
            applied_labels.update()
            .where(
                applied_labels.c.tenant_id == tenant_id,
                applied_labels.c.result_key == sa.bindparam("k"),
            )
            .values(applied_at=now),
            moved,
        )
    for chunk in _chunks(gone):
        conn.execute(results.delete().where(r.key.in_(chunk)))
    d = dead_letters.c
    have_dead = {
        str(x[0]): (str(x[3]), str(x[4]), int(x[5]))
        for x in conn.execute(
            sa.select(d.key, d.post_id, d.content_hash, d.outcome, d.reason, d.attempts).where(
                *_same(dead_letters, tenant_id, slices, labels)
            )
        )
        if current.get(str(x[1]), ("",))[0] == x[2]
    }
    fresh = {
        k: row
        for k, row in want_dead.items()
        if have_dead.get(k) != (row["outcome"], row["reason"], row["attempts"])
    }
    stale = [k for k in have_dead if k not in want_dead or k in fresh]
    for chunk in _chunks(stale):
        conn.execute(dead_letters.delete().where(d.key.in_(chunk)))
    if fresh:
        conn.execute(
            dead_letters.insert(), [{**common, **row, "at": now} for row in fresh.values()]
        )
    routes.rerouted = len(moved) + len(gone)


def _answer(row: dict[str, Any]) -> tuple[Any, ...]:
    """What a composed label says, apart from the version of the rules it was routed by."""
    return tuple(row[c] for c in _COMPARED if c != "mapping")


def _chunks(keys: Sequence[str], size: int = 5_000) -> list[list[str]]:
    return [list(keys[i : i + size]) for i in range(0, len(keys), size)]
