"""A cascade's stored answers for a gold set, and what a setting of its decide rules makes of
them (issue 49): each stage's answer and booked cost for every gold post, read from the store,
routed by the domain's sweep (``domain/cascade/sweep.py``, the same ``decides`` a run routes
by) into each post's answer and the calls its route pays for.

``evaluate`` under a cascade prices the calls the cascade's routes make (not every stage's
answer stored for a gold post: after a sweep every stage has answered every one of them); the
threshold sweep (``cascade_sweep.py``) reads its inputs here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from backfill_assets.domain.cascade import stage_score
from backfill_assets.domain.cascade.measure import GoldPost, Setting, StageAnswer
from backfill_assets.domain.cascade.sweep import route
from backfill_assets.domain.work.keys import work_key
from backfill_assets.ingest.gold import GoldSet
from backfill_assets.ledger import evaluations as evals
from backfill_assets.ledger.labels.cascade_routes import RouteStage
from backfill_assets.ledger.run.work import FINAL_DEAD_OUTCOMES

Spend = tuple[int, int, int, int]  # tokens in, tokens out, nano-dollars, calls
_NOTHING: Spend = (0, 0, 0, 0)


@dataclass(frozen=True)
class StoredGold:
    """Per gold row (in the gold set's order): its post id, the sweep's input, and per stage
    the stored answer and what the ledger booked for the stage's key."""

    post_ids: list[str]
    posts: list[GoldPost]
    answers: list[list[evals.Answer]]  # [stage][row]
    booked: list[list[Spend]]  # [stage][row]


def own_setting(stages: Sequence[RouteStage]) -> Setting:
    """The rules the stages carry (the file's own setting)."""
    return tuple(s.decide for s in stages[:-1])


def read_stored(
    conn: Connection, tenant: str, gold: GoldSet, stages: Sequence[RouteStage]
) -> StoredGold:
    """Every stage's stored answer and booked spend for each gold post's current text."""
    ids = [row.post.post_id for row in gold.rows]
    answers: list[list[evals.Answer]] = []
    booked: list[list[Spend]] = []
    for stage in stages:
        got = evals.answers(conn, tenant, ids, stage.versions)
        keys = [
            work_key(stage.versions, tenant, row.post.post_id, row.post.content_hash)
            for row in gold.rows
        ]
        spent = evals.booked_by_key(conn, tenant, keys)
        answers.append([got[i] for i in ids])
        booked.append([spent.get(k, _NOTHING) for k in keys])
    posts = [
        GoldPost(
            row.label,
            tuple(
                _stage_answer(stage.dialect, answers[k][i], booked[k][i][2])
                for k, stage in enumerate(stages)
            ),
        )
        for i, row in enumerate(gold.rows)
    ]
    return StoredGold(ids, posts, answers, booked)


def _stage_answer(dialect: str, answer: evals.Answer, cost_nanos: int) -> StageAnswer:
    if answer.label is None:
        return StageAnswer(None, None, cost_nanos, answer.outcome in FINAL_DEAD_OUTCOMES)
    confidence = 0.0 if answer.confidence is None else answer.confidence
    return StageAnswer(answer.label, stage_score(dialect, answer.p_label, confidence), cost_nanos)


def routed(
    stored: StoredGold, setting: Setting, none_label: str
) -> tuple[dict[str, evals.Answer], Spend]:
    """What ``setting`` makes of the stored answers: each post's answer (the deciding stage's,
    or the outcome of the stage it stopped at) and the spend of the calls its route makes."""
    out: dict[str, evals.Answer] = {}
    total = [0, 0, 0, 0]
    last = len(stored.answers) - 1
    for i, (post_id, post) in enumerate(zip(stored.post_ids, stored.posts, strict=True)):
        way = route(setting, post.answers, none_label)
        out[post_id] = stored.answers[way.stage][i]
        for k in range(way.stage + 1):
            if k < last and k < len(setting) and setting[k] is None:
                continue  # off: never sent
            for f, value in enumerate(stored.booked[k][i]):
                total[f] += value
    return out, (total[0], total[1], total[2], total[3])
