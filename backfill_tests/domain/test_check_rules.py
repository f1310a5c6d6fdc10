"""The pure checking core without a database: ``verify_scope``, the check rules' ``evaluate``
and the budget's ``grant_size``, on rows built by hand."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from backfill_assets.domain.checks.rules import CheckBounds, DriftRule, PartitionEvidence, evaluate
from backfill_assets.domain.checks.verify import verify_scope
from backfill_assets.domain.money.budgets import grant_size
from backfill_assets.domain.work.keys import Versions, slice_of, work_key

V = Versions("t1", "p1", "m1")
TENANT = "acme"
POSTS = {f"p{i}": f"{i:02x}" * 32 for i in range(6)}

# The settings' defaults (ChecksSettings), spelled out: the pure rules take them as values.
BOUNDS = CheckBounds(
    max_rebilled_share=0.05,
    max_orphan_attempts=16,
    max_tokens_per_key=0,
    max_over_bound_calls=0,
    max_stage_share_drift=0.15,
    drift=DriftRule(labels=(), factor=5.0, min_count=5),
    min_kappa=0.6,
)


def result(post_id: str, tenant: str = TENANT, **change: Any) -> dict[str, Any]:
    h = POSTS[post_id]
    row = {
        "key": work_key(V, tenant, post_id, h),
        "tenant_id": tenant,
        "slice": slice_of(tenant, post_id),
        "post_id": post_id,
        "content_hash": h,
        "task_version": V.task_version,
        "key_version": V.key_version,
        "model": V.model,
        "label": "ok",
    }
    row.update(change)
    return row


def attempt(row: dict[str, Any], n: int = 1) -> dict[str, Any]:
    return {
        "type": "attempt",
        "attempt_id": f"{row['key']}-{n}",
        **{k: row[k] for k in ("key", "tenant_id", "slice", "post_id", "content_hash")},
        **{k: row[k] for k in ("task_version", "key_version", "model")},
    }


def usage(row: dict[str, Any], n: int = 1, tokens: int = 100, ident: int = 0) -> dict[str, Any]:
    return {
        "type": "usage",
        "id": ident or n,
        "attempt_id": f"{row['key']}-{n}",
        "key": row["key"],
        "tenant_id": row["tenant_id"],
        "tokens_in": tokens - 10,
        "tokens_out": 10,
        "usage_shape": "split",
        "bound_tokens": 10_000,
    }


def scope(results: list[dict[str, Any]], ledger: list[dict[str, Any]] | None = None) -> Any:
    return verify_scope(TENANT, POSTS, results, [], ledger or [], V)


def test_a_complete_scope_has_no_problems() -> None:
    rows = [result(p) for p in POSTS]
    rep, problems = scope(rows, [e for r in rows for e in (attempt(r), usage(r))])
    assert problems == []
    assert (rep.expected, rep.done, rep.missing, rep.billed_tokens) == (6, 6, 0, 600)
    assert rep.orphan_attempts == 0 and rep.rebilled_tokens == 0


def test_missing_keys_are_counted_and_sampled() -> None:
    rep, problems = scope([result("p0")])
    assert problems == [] and (rep.done, rep.missing, len(rep.missing_keys)) == (1, 5, 5)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"tenant_id": "globex"}, "row tenant 'globex' is not 'acme'"),
        ({"slice": 99}, "row filed in slice 99"),
        ({"post_id": "nope"}, "post does not exist"),
        ({"model": "m2"}, "key does not recompute"),
        ({"content_hash": "ff" * 32}, "key does not recompute"),
    ],
)
def test_a_row_that_does_not_derive_from_the_tenants_post_is_an_isolation_failure(
    change: dict[str, Any], why: str
) -> None:
    bad = {**result("p1"), **change}
    if "post_id" in change:
        bad["slice"] = slice_of(TENANT, "nope")
    _, problems = scope([result("p0"), bad])
    assert [(p.kind, p.table) for p in problems] == [("isolation", "results")]
    assert why in problems[0].detail


def test_a_forged_hash_that_recomputes_is_caught_a_sent_old_text_is_stale() -> None:
    old = "ee" * 32
    stale = result("p2", content_hash=old, key=work_key(V, TENANT, "p2", old))
    _, problems = scope([stale])
    assert [p.detail for p in problems] == [
        "content hash is not the post's text, and no attempt of this tenant sent it"
    ]
    rep, problems = scope([stale], [attempt(stale)])
    assert problems == [] and rep.stale == 1 and rep.done == 0  # the current text is still due


def test_duplicates_and_a_key_both_accepted_and_dead_are_found() -> None:
    row = result("p3")
    dead = {**row, "outcome": "retry_exhausted"}
    rep, problems = verify_scope(TENANT, POSTS, [row, dict(row)], [dead], [], V)
    details = sorted(p.detail for p in problems if p.kind == "duplicate")
    assert details == [
        "2 result rows",
        "2 results for post 'p3'",
        "key is both accepted and dead-lettered",
    ]
    assert rep.done == 1


def test_a_second_paid_answer_is_rebilled_and_an_unanswered_attempt_an_orphan() -> None:
    a, b = result("p0"), result("p1")
    ledger = [attempt(a, 1), usage(a, 1), attempt(a, 2), usage(a, 2, ident=9), attempt(b)]
    rep, _ = scope([a, b], ledger)
    assert rep.rebilled_tokens == 100 and rep.orphan_attempts == 1


def _evidence(results: list[dict[str, Any]], ledger: list[dict[str, Any]]) -> PartitionEvidence:
    home = slice_of(TENANT, "p0")
    posts = {p: h for p, h in POSTS.items() if slice_of(TENANT, p) == home}
    return PartitionEvidence(TENANT, home, V, posts, results, [], ledger)


def test_evaluate_gives_one_result_per_check_with_a_command_to_inspect() -> None:
    ev = _evidence([result("p0", tenant="globex", slice=slice_of(TENANT, "p0"))], [])
    check_results = {v.name: v for v in evaluate(ev, BOUNDS)}
    assert (
        not check_results["isolation"].passed
        and check_results["isolation"].counts["in_results"] == 1
    )
    assert not check_results["coverage"].passed
    assert check_results["no_duplicates"].passed and check_results["output_schema"].passed
    assert check_results["isolation"].inspect.endswith("--name isolation")
    assert check_results["isolation"].blocking and not check_results["label_drift"].blocking


def test_spend_fails_past_the_orphan_bound_and_drift_past_its_factor() -> None:
    home = slice_of(TENANT, "p0")
    rows = [result(p, label="spam") for p in POSTS if slice_of(TENANT, p) == home]
    ledger = [attempt(r) for r in rows]  # every call unanswered: orphans
    ev = _evidence(rows, ledger)
    ev.baseline, ev.baseline_source = {"spam": 0.01}, "configured"
    bounds = replace(BOUNDS, max_orphan_attempts=0, drift=DriftRule(("spam",), 5.0, 1))
    got = {v.name: v for v in evaluate(ev, bounds, ["spend", "label_drift"])}
    assert not got["spend"].passed and "orphan attempts" in got["spend"].summary
    assert not got["label_drift"].passed
    relaxed = replace(BOUNDS, max_orphan_attempts=len(rows), drift=DriftRule(("spam",), 500.0, 1))
    got = {v.name: v for v in evaluate(ev, relaxed, ["spend", "label_drift"])}
    assert got["spend"].passed and got["label_drift"].passed


def test_stage_drift_compares_the_first_stages_share_with_the_gold_sets() -> None:
    # Six posts; the first stage decided the first k of them, the judge the rest.
    def rows(k: int) -> list[dict[str, Any]]:
        return [result(p, stage="screen" if i < k else "judge") for i, p in enumerate(POSTS)]

    def ev(k: int, gold: float | None) -> PartitionEvidence:
        e = PartitionEvidence(TENANT, 0, V, POSTS, rows(k), [], [])
        e.stage_share = None if gold is None else ("screen", gold)
        return e

    bounds = replace(BOUNDS, drift=DriftRule((), 5.0, 5))
    [one] = evaluate(ev(3, None), bounds, ["stage_drift"])
    assert one.passed and "not a cascade" in one.summary and not one.blocking
    [near] = evaluate(ev(5, 0.75), bounds, ["stage_drift"])  # 83% against 75%
    assert near.passed and near.counts["first_stage_decided"] == 5
    [far] = evaluate(ev(2, 0.75), bounds, ["stage_drift"])  # 33% against 75%
    assert not far.passed and "33.3% of 6 labels; the gold set 75.0%" in far.summary
    assert far.warn and not far.blocking
    # Labels of an older text, or of another model, are not the cascade's: not counted.
    stale = ev(2, 0.75)
    stale.results = [*stale.results, result("p0", model="other", stage="screen")]
    assert evaluate(stale, bounds, ["stage_drift"])[0].counts["labels"] == 6
    # Too few labels to say.
    few = PartitionEvidence(TENANT, 0, V, POSTS, rows(6)[:4], [], [])
    few.stage_share = ("screen", 0.1)
    assert evaluate(few, bounds, ["stage_drift"])[0].passed


@pytest.mark.parametrize(
    ("want", "minimum", "free", "granted"),
    [
        (100, 10, 1000, 100),  # plenty: what was asked
        (800, 10, 1000, 500),  # never more than half of what is free...
        (800, 600, 1000, 600),  # ...unless the minimum needs more
        (100, 10, 5, None),  # not even the minimum: refused
        (100, 10, 0, None),  # nothing free
        (100, 0, 0, 0),  # a call that costs nothing is not refused
        (100, 10, 10, 10),  # exactly the minimum
    ],
)
def test_grant_size(want: int, minimum: int, free: int, granted: int | None) -> None:
    assert grant_size(want, minimum, free) == granted
