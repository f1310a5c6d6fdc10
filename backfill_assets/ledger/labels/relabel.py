"""Re-labelling from stored answers: a changed threshold or category is not new work (issue 48).

In a dialect whose answer is mapped onto the policy by its ``dialects:`` section, a result keeps
the answer as the call returned it and the section's hash it was read under (``raw_result``,
``mapping``; sql/022). The section is not sent to the model, so it is not part of the keys: when
it changes, a partition's results of the same keys are read again under the new section, here,
without a call, and updated in place (label, rules, confidence, probability, mapping). The apply
then carries the new labels to ``applied_labels``, the posts and the sink as any change; the
applied rows of re-read results are stamped applied now, so the sink also takes a new
confidence or probability under an unchanged label.

An answer the new section cannot read (it names a category the stored answer lacks) keeps its
label and is counted apart, never guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.domain.policy.output_gate import OutputRejected
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.engine import read_tx, write_tx
from backfill_assets.ledger.tables import applied_labels, results, utcnow

# Results re-read and updated per transaction: bounds memory on a large partition.
_BATCH = 5_000


@dataclass
class Relabelled:
    """What one partition's re-labelling did."""

    changed: int = 0
    unreadable: int = 0


def relabel(
    engine: Engine, tenant_id: str, slices: Sequence[int], versions: Versions, rubric: Rubric
) -> Relabelled:
    """Re-read the partition's results of ``versions`` stored under another mapping; the caller
    holds the partition's writer lock. Nothing to do (and no query) outside a mapped dialect."""
    done = Relabelled()
    if not versions.mapping:
        return done
    r = results.c
    stale = (
        sa.select(r.key, r.raw_result, r.post_id)
        .where(
            r.tenant_id == tenant_id,
            r.slice.in_(list(slices)),
            r.task_version == versions.task_version,
            r.key_version == versions.key_version,
            r.model == versions.model,
            r.raw_result.is_not(None),
            sa.or_(r.mapping.is_(None), r.mapping != versions.mapping),
        )
        .order_by(r.key)
    )
    after = ""
    while True:
        with read_tx(engine) as conn:
            rows = conn.execute(stale.where(r.key > after).limit(_BATCH)).all()
        if not rows:
            return done
        updates = []
        for key, raw, post_id in rows:
            try:
                out, p_label = rubric.read(str(raw), str(key))
            except OutputRejected:
                done.unreadable += 1
                continue
            updates.append(
                {
                    "k": key,
                    "post": post_id,
                    "label": out.label,
                    "rule_ids": ",".join(out.rule_ids),
                    "confidence": out.confidence,
                    "p_label": p_label,
                    "mapping": versions.mapping,
                }
            )
        if updates:
            with write_tx(engine) as conn:
                conn.execute(
                    results.update()
                    .where(r.key == sa.bindparam("k"))
                    .values(
                        label=sa.bindparam("label"),
                        rule_ids=sa.bindparam("rule_ids"),
                        confidence=sa.bindparam("confidence"),
                        p_label=sa.bindparam("p_label"),
                        mapping=sa.bindparam("mapping"),
                    ),
                    updates,
                )
                al = applied_labels.c
                conn.execute(
                    applied_labels.update()
                    .where(
                        al.tenant_id == tenant_id,
                        al.post_id == sa.bindparam("post"),
                        al.policy_id == rubric.policy.policy_id,
                        al.result_key == sa.bindparam("k"),
                    )
                    .values(applied_at=utcnow()),
                    [{"k": u["k"], "post": u["post"]} for u in updates],
                )
            done.changed += len(updates)
        after = str(rows[-1][0])
