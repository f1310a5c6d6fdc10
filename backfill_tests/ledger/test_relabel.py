"""Re-labelling from stored answers (``ledger/labels/relabel.py``), on both stores: only the
partition's results of these versions stored under another mapping are re-read; an answer the
new mapping cannot read keeps its label; a result with nothing stored is never touched."""

from __future__ import annotations

import datetime as dt
import json

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.domain.policy.dialect_sections import MODERATION_CATEGORIES
from backfill_assets.domain.policy.file import parse_policy
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.labels.relabel import relabel
from backfill_assets.ledger.tables import applied_labels, results, utcnow
from backfill_tests.domain.test_moderation_dialect import BASE, MAPPING


def _scores(**pins: float) -> str:
    scores = dict.fromkeys(MODERATION_CATEGORIES, 0.01) | {
        k.replace("_", "/"): v for k, v in pins.items()
    }
    return json.dumps({"category_scores": scores})


def _row(key: str, tenant: str, slice_no: int, raw: str | None, mapping: str | None) -> dict:
    return {
        "key": key,
        "tenant_id": tenant,
        "post_id": key,
        "slice": slice_no,
        "content_hash": "c" * 64,
        "label": "ok",
        "rule_ids": "",
        "confidence": 0.5,
        "p_label": None,
        "raw_result": raw,
        "mapping": mapping,
        "model": "omni-moderation-latest",
        "key_version": "kv",
        "task_version": "t",
        "run_id": "run",
        "created_at": utcnow(),
    }


def test_only_this_partitions_stale_answers_are_read_again(engine: Engine) -> None:
    rubric = Rubric(parse_policy(BASE + MAPPING), "openai-moderation")
    versions = Versions("t", "kv", "omni-moderation-latest", rubric.policy.mapping_version)
    hot = _scores(violence=0.9)
    rows = [
        _row("a1", "acme", 3, hot, "old"),  # stale: read again
        _row("a2", "acme", 3, hot, versions.mapping),  # read under this mapping already
        _row("a3", "acme", 3, None, None),  # nothing stored (another dialect's row)
        _row("a4", "acme", 3, '{"scores": {}}', "old"),  # the new mapping cannot read it
        _row("a5", "acme", 4, hot, "old"),  # another partition
        _row("b1", "globex", 3, hot, "old"),  # another tenant
    ]
    old = utcnow() - dt.timedelta(days=1)
    applied = [
        {
            "tenant_id": row["tenant_id"],
            "post_id": row["post_id"],
            "policy_id": rubric.policy.policy_id,
            "label": "ok",
            "rule_ids": "",
            "policy_version": "3",
            "key_version": "kv",
            "model": row["model"],
            "result_key": row["key"],
            "content_hash": row["content_hash"],
            "applied_at": old,
        }
        for row in rows
    ]
    with engine.begin() as conn:
        conn.execute(results.insert(), rows)
        conn.execute(applied_labels.insert(), applied)
    done = relabel(engine, "acme", [3], versions, rubric)
    assert (done.changed, done.unreadable) == (1, 1)
    with engine.connect() as conn:
        got = {
            r.key: (r.label, r.rule_ids, r.p_label, r.mapping)
            for r in conn.execute(sa.select(results))
        }
    assert got["a1"] == ("threat", "T1", 0.9, versions.mapping)
    for untouched in ("a2", "a3", "a4", "a5", "b1"):
        assert got[untouched][0] == "ok", untouched
    # The re-read post's applied row is stamped now (the sink takes its new confidence and
    # probability even under an unchanged label); no other row is touched.
    with engine.connect() as conn:
        stamped = dict(
            conn.execute(sa.select(applied_labels.c.post_id, applied_labels.c.applied_at)).all()
        )
    assert stamped["a1"] > old and all(stamped[k] == old for k in stamped if k != "a1")
    # A second pass has nothing left to read.
    assert relabel(engine, "acme", [3], versions, rubric).changed == 0
    # Outside a mapped dialect, no query at all.
    chat = Versions("t", "kv", "m")
    assert relabel(engine, "globex", [3], chat, Rubric(parse_policy(BASE))).changed == 0
