"""``evaluate GOLD --cascade FILE``: the cascade optimiser (issue 49). Every gold post is sent to
every stage once, each stage as one model through the backfill's own keys, ledger and
dispatcher (a rerun, or a stage whose answers a run already stored, sends nothing); then each
setting of the decide rules is routed over the stored answers (``domain/cascade/sweep.py``),
without a call.

One setting's evaluation is recorded, as ``evaluate`` records one: the chosen one
(``--target-macro-f1``), else the file's own, under the versions a run with that setting's file
would have (the cascade's key version and model ``cascade``, its decide rules in the mapping
version), so ``BACKFILL_POLICY_MIN_MACRO_F1`` gates that file as it gates one model. Its report
holds the sweep's frontier, which ``policy_evaluation`` shows.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from backfill_assets.config.stages import CASCADE_MODEL, Stage, Stages
from backfill_assets.defs.model_resources import (
    CascadeModelResource,
    ModelResource,
    stage_runs,
)
from backfill_assets.defs.reporting.cascade_gold import (
    Spend,
    StoredGold,
    own_setting,
    read_stored,
    routed,
)
from backfill_assets.defs.reporting.evaluation import PolicyResult, gold_refs, gold_report
from backfill_assets.dispatch.partition_run import RunOptions
from backfill_assets.dispatch.pipeline import run_partitions
from backfill_assets.domain.cascade import Cascade
from backfill_assets.domain.cascade.measure import RESAMPLES, SEED
from backfill_assets.domain.cascade.sweep import (
    SettingFigures,
    best_lower_bound,
    choose,
    sweep,
    with_setting,
)
from backfill_assets.domain.money.nanos import usd_text
from backfill_assets.ingest.gold import GoldSet
from backfill_assets.ledger import evaluations as evals
from backfill_assets.ledger.engine import read_tx, write_tx


@dataclass
class CascadeSweep:
    """What ``evaluate --cascade`` found: its JSON document (module docstring of
    ``cli/commands/cascade.py``), the chosen setting's cascade (None: no target, or none
    reached it) and the evaluation recorded."""

    doc: dict[str, Any]
    chosen: Cascade | None
    recorded: PolicyResult
    best_lower_bound: float


def sweep_cascade(
    engine: Engine,
    gold: GoldSet,
    model: ModelResource,
    stages_of: Callable[[Cascade], Stages],
    options: RunOptions,
    tenant: str,
    source: tuple[str, str],
    target: float | None,
    cascade_file: str,
    log: Callable[[str], None] = lambda _m: None,
) -> CascadeSweep:
    """Send every gold post to every stage (what is stored is not sent again), sweep the decide
    rules over the stored answers, and record the chosen (else the file's own) setting's
    evaluation. ``stages_of``: a cascade's stages as the settings build them (for the file a
    setting makes); ``source``: the gold file's name and sha256; ``cascade_file``: the file's
    name, as the reports show it."""
    if not isinstance(model, CascadeModelResource) or model.stages is None:
        raise TypeError("a threshold sweep needs a cascade's model resource")
    cascade = model.stages.cascade
    names = [s.name for s in cascade.stages]
    refs = gold_refs(engine, tenant)
    wanted = {row.post.post_id for row in gold.rows}
    sync = dataclasses.replace(options, dispatch_mode="sync", batch=None, ahead=None)
    run_id = f"evaluate-{uuid.uuid4().hex[:12]}"
    runs = stage_runs(model)
    started = time.monotonic()
    calls: list[int] = []
    for stage in runs:
        reports = run_partitions(
            engine,
            refs,
            stage.make_adapter,
            stage.route.versions,
            stage.rubric,
            run_id,
            dataclasses.replace(sync, lanes=stage.lanes),
            log=_prefixed(log, stage.route.name),
            only_posts=wanted,
        )
        calls.append(sum(r.stats.calls for r in reports))
    sent_s = time.monotonic() - started
    route = [s.route for s in runs]
    policy = model.stages.rubric.policy
    with read_tx(engine) as conn:
        stored = read_stored(conn, tenant, gold, route)
    started = time.monotonic()
    swept = sweep(own_setting(route), stored.posts, policy.label_ids, policy.none_label)
    swept_s = time.monotonic() - started
    chosen = choose(swept.settings, target) if target is not None else None
    best = best_lower_bound(swept.settings)
    doc: dict[str, Any] = {
        "cascade": cascade_file,
        "gold": {"file": source[0], "sha256": source[1], "rows": len(gold.rows)},
        "stages": [
            _stage_doc(s, calls[k], stored.booked[k]) for k, s in enumerate(model.stages.stages)
        ],
        "target_macro_f1": target,
        "settings": [f.as_dict(names) for f in swept.settings],
        "frontier": [f.as_dict(names) for f in swept.frontier],
        "own": swept.own.as_dict(names),
        "chosen": None if chosen is None else chosen.as_dict(names),
        "best_lower_bound": best.as_dict(names),
        "bootstrap": {"resamples": RESAMPLES, "seed": SEED, "interval": "percentile 95%"},
        "calls_this_run": sum(calls),
        "seconds": {"stages": round(sent_s, 3), "sweep": round(swept_s, 3)},
    }
    kept = chosen or swept.own
    written = with_setting(cascade, kept.setting)
    recorded = _record(engine, gold, stages_of(written), stored, kept, doc, tenant, source)
    return CascadeSweep(doc, written if chosen else None, recorded, best.ci95[0])


def _prefixed(log: Callable[[str], None], stage: str) -> Callable[[str], None]:
    """A stage's log lines, each saying which stage it is."""
    return lambda message: log(f"[{stage}] {message}")


def _stage_doc(stage: Stage, calls: int, booked: list[Spend]) -> dict[str, Any]:
    rule = stage.decide
    return {
        "name": stage.name,
        "dialect": stage.rubric.dialect,
        "model": stage.model.name,
        "decide": None if rule is None else {"when": rule.when, "min_score": rule.min_score},
        "calls_this_run": calls,
        # What the stage booked for the gold posts, all of them sent to it.
        "cost_usd": usd_text(sum(b[2] for b in booked)),
    }


def _record(
    engine: Engine,
    gold: GoldSet,
    stages: Stages,
    stored: StoredGold,
    kept: SettingFigures,
    doc: dict[str, Any],
    tenant: str,
    source: tuple[str, str],
) -> PolicyResult:
    """The kept setting's evaluation, under the versions of its own file's run."""
    rubric, versions = stages.rubric, stages.versions
    answers, spend = routed(stored, kept.setting, rubric.policy.none_label)
    report, labels = gold_report(rubric, versions, gold, answers, spend, doc["calls_this_run"])
    report["tenant"] = tenant
    report["gold"] = {"file": source[0], "sha256": source[1], "rows": len(gold.rows)}
    report[evals.SWEEP_FIELD] = {
        "file": doc["cascade"],
        "stages": [s["name"] for s in doc["stages"]],
        "settings": len(doc["settings"]),
        "target_macro_f1": doc["target_macro_f1"],
        "own": doc["own"],
        "chosen": doc["chosen"],
        "frontier": doc["frontier"],
    }
    with write_tx(engine) as conn:
        evaluation_id = evals.record(
            conn, rubric.policy, CASCADE_MODEL, tenant, (*source, len(gold.rows)), report
        )
    return PolicyResult(rubric, versions, report, labels, evaluation_id)
