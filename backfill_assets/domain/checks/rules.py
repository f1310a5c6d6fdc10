"""The partition checks' rules, as pure functions over one partition's rows (what the checks
are and how they are grouped: ``check_defs.py``).

One checking core (``verify.verify_scope``) feeds the Dagster asset checks, the
``applied_labels`` gate and ``backfill-moderation check``; this module turns its findings into
one check result per check, with metadata a person can act on (counts, a few keys, never post text).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backfill_assets.domain.checks.catalog import CHECK_NAMES, CheckResult, inspect_command
from backfill_assets.domain.checks.verify import Problem, ScopeReport, verify_scope
from backfill_assets.domain.policy.agreement import Pairs, agreement
from backfill_assets.domain.work.keys import Versions

Row = Mapping[str, Any]
SAMPLE = 5
# A label the baseline never saw still needs a floor, or any single occurrence is "infinite" drift.
BASELINE_FLOOR = 0.01


@dataclass(frozen=True, slots=True)
class DriftRule:
    """When a label's share counts as drifted (``ChecksSettings.bounds`` builds it: the
    policy's flagging labels unless configured)."""

    labels: tuple[str, ...]
    factor: float
    min_count: int


@dataclass(frozen=True, slots=True)
class CheckBounds:
    """Configured bounds of the non-structural checks (``ChecksSettings.bounds`` builds them
    from the settings, where each is declared with its default and meaning)."""

    max_rebilled_share: float
    max_orphan_attempts: int
    max_tokens_per_key: int
    # Calls billed past their reserved bound a partition may hold and still be applied.
    max_over_bound_calls: int
    # A cascade's first stage's share of a partition's labels may stray this far from the
    # gold set's (``stage_drift``).
    max_stage_share_drift: float
    drift: DriftRule
    # Cohen's kappa between the model and moderators below this warns (``agreement``).
    min_kappa: float


@dataclass
class PartitionEvidence:
    """Everything the checks read about one partition (no post text)."""

    tenant: str
    slice: int
    versions: Versions
    posts: Mapping[str, str]
    results: Sequence[Row]
    dead: Sequence[Row]
    ledger: Sequence[Row]
    schema_problems: Sequence[tuple[str, str]] = ()
    baseline: Mapping[str, float] | None = None
    baseline_source: str = "none"
    deferred: int | None = None
    # post_id -> its expected key under ``versions``, when the caller computed them already.
    expected_keys: Mapping[str, str] | None = None
    # A cascade's first stage and the share of the gold set's posts it decided (None: one
    # model, or no threshold sweep of the decide rules in force).
    stage_share: tuple[str, float] | None = None
    # (post id, why) of moderators' labels in force here that are not a decision about that
    # post of this tenant (``ledger/evidence``): an isolation failure.
    foreign_decisions: Sequence[tuple[str, str]] = ()
    # The tenant's (model label, moderator's label) -> decided posts under the policy version
    # in force (``ledger/decisions/agreement.py``); None: not read.
    agreement: Pairs | None = None


def _sample(problems: Iterable[Problem], n: int) -> tuple[str, ...]:
    out: list[str] = []
    for p in problems:
        ident = f"{p.table}:{p.key}" if p.key else p.table
        out.append(f"{ident} {p.detail}")
        if len(out) == n:
            break
    return tuple(out)


def evaluate(
    ev: PartitionEvidence,
    bounds: CheckBounds,
    names: Iterable[str] = CHECK_NAMES,
    sample: int = SAMPLE,
) -> list[CheckResult]:
    """Check results of the named checks for one partition; ``sample`` bounds the keys listed."""
    wanted = list(names)
    rep, problems = verify_scope(
        ev.tenant,
        ev.posts,
        ev.results,
        ev.dead,
        ev.ledger,
        ev.versions,
        sample=sample,
        expected_keys=ev.expected_keys,
    )
    out: list[CheckResult] = []
    for name in wanted:
        if name == "isolation":
            found = [p for p in problems if p.kind == "isolation"]
            found += [
                Problem("isolation", ev.tenant, "applied_labels", post, why)
                for post, why in ev.foreign_decisions
            ]
            v = _kind_result(name, found, "row(s)", sample)
        elif name == "no_duplicates":
            found = [p for p in problems if p.kind == "duplicate"]
            v = _kind_result(name, found, "duplicate(s)", sample)
        elif name == "coverage":
            v = _coverage(rep, ev)
        elif name == "output_schema":
            v = _schema(ev, sample)
        elif name == "spend":
            v = _spend(rep, bounds, sample)
        elif name == "billed_within_bound":
            v = _within_bound(problems, bounds, sample)
        elif name == "label_drift":
            v = _drift(ev, bounds.drift)
        elif name == "stage_drift":
            v = _stage_drift(ev, bounds)
        elif name == "agreement":
            v = agreement_result(ev.agreement or {}, bounds)
        else:
            raise ValueError(f"unknown check {name!r}")
        out.append(_with_inspect(v, ev))
    return out


def _with_inspect(v: CheckResult, ev: PartitionEvidence) -> CheckResult:
    return CheckResult(
        name=v.name,
        passed=v.passed,
        summary=v.summary,
        counts=v.counts,
        sample_keys=v.sample_keys,
        table=v.table,
        inspect=inspect_command(ev.tenant, ev.slice, v.name),
    )


def _kind_result(name: str, found: list[Problem], noun: str, sample: int) -> CheckResult:
    by_table = Counter(p.table for p in found)
    counts: dict[str, int | float] = {"problems": len(found)}
    counts.update({f"in_{t}": n for t, n in sorted(by_table.items())})
    summary = "no problems" if not found else f"{len(found)} {noun} failed {name}"
    return CheckResult(name, not found, summary, counts, _sample(found, sample))


def _coverage(rep: ScopeReport, ev: PartitionEvidence) -> CheckResult:
    counts: dict[str, int | float] = {
        "expected": rep.expected,
        "accepted": rep.done,
        "dead_lettered": rep.dead,
        "missing": rep.missing,
        "stale": rep.stale,
    }
    for outcome, n in sorted(rep.dead_by_outcome.items()):
        counts[f"dead_{outcome}"] = n
    if ev.deferred is not None:
        counts["deferred_last_run"] = ev.deferred
    ok = rep.missing == 0
    summary = (
        f"all {rep.expected} expected key(s) accepted or dead-lettered"
        if ok
        else f"{rep.missing} of {rep.expected} expected key(s) neither accepted nor dead-lettered"
    )
    return CheckResult("coverage", ok, summary, counts, tuple(rep.missing_keys))


def _schema(ev: PartitionEvidence, sample: int) -> CheckResult:
    bad = list(ev.schema_problems)
    reasons = Counter(why for _k, why in bad)
    counts: dict[str, int | float] = {"rows": len(ev.results), "invalid_rows": len(bad)}
    table = None
    if reasons:
        lines = ["| failure | rows |", "|---|---:|"]
        lines += [f"| {why} | {n} |" for why, n in reasons.most_common(10)]
        table = "\n".join(lines)
    summary = "all rows pass" if not bad else f"{len(bad)} row(s) fail the result schema"
    keys = tuple(f"{k} {why}" for k, why in bad[:sample])
    return CheckResult("output_schema", not bad, summary, counts, keys, table)


def _spend(rep: ScopeReport, b: CheckBounds, sample: int) -> CheckResult:
    allowed_rebill = int(b.max_rebilled_share * rep.billed_tokens)
    reasons: list[str] = []
    if rep.rebilled_tokens > allowed_rebill:
        reasons.append(f"rebilled {rep.rebilled_tokens} > {allowed_rebill} tokens")
    if rep.orphan_attempts > b.max_orphan_attempts:
        reasons.append(f"orphan attempts {rep.orphan_attempts} > {b.max_orphan_attempts}")
    per_key = rep.billed_tokens / rep.expected if rep.expected else 0.0
    if b.max_tokens_per_key and per_key > b.max_tokens_per_key:
        reasons.append(f"{per_key:.0f} tokens per key > {b.max_tokens_per_key}")
    counts: dict[str, int | float] = {
        "billed_tokens": rep.billed_tokens,
        "rebilled_tokens": rep.rebilled_tokens,
        "rebilled_tokens_allowed": allowed_rebill,
        "orphan_attempts": rep.orphan_attempts,
        "orphan_attempts_allowed": b.max_orphan_attempts,
        "tokens_per_key": round(per_key, 1),
        "usage_missing": rep.usage_missing,
        "over_bound_calls": rep.over_bound,
    }
    keys = tuple(f"rebilled {k}" for k in rep.rebilled_keys) + tuple(
        f"orphan {k}" for k in rep.orphan_keys
    )
    summary = "; ".join(reasons) if reasons else "within bounds"
    return CheckResult("spend", not reasons, summary, counts, keys[:sample])


def _within_bound(problems: list[Problem], b: CheckBounds, sample: int) -> CheckResult:
    found = [p for p in problems if p.kind == "over_bound"]
    counts: dict[str, int | float] = {
        "over_bound_calls": len(found),
        "over_bound_calls_allowed": b.max_over_bound_calls,
    }
    if len(found) <= b.max_over_bound_calls:
        summary = "no call billed past its bound" if not found else f"{len(found)} allowed"
        return CheckResult("billed_within_bound", True, summary, counts, _sample(found, sample))
    summary = (
        f"{len(found)} call(s) billed past their reserved bound "
        f"(allowed {b.max_over_bound_calls}): the provider billed more than the tokens sent"
    )
    return CheckResult("billed_within_bound", False, summary, counts, _sample(found, sample))


def label_counts(ev: PartitionEvidence) -> Counter[str]:
    """Accepted labels of this tenant under the current versions."""
    v = ev.versions
    return Counter(
        str(r["label"])
        for r in ev.results
        if r["tenant_id"] == ev.tenant
        and (r["task_version"], r["key_version"], r["model"])
        == (v.task_version, v.key_version, v.model)
    )


def drifted_labels(
    counts: Mapping[str, int], baseline: Mapping[str, float], rule: DriftRule
) -> tuple[list[str], str]:
    """Watched labels over ``factor`` x their baseline share, and a markdown table."""
    total = sum(counts.values())
    lines = ["| label | count | share | baseline | ratio |", "|---|---:|---:|---:|---:|"]
    drifted: list[str] = []
    for label in sorted(set(counts) | set(baseline)):
        n = counts.get(label, 0)
        share = n / total if total else 0.0
        base = baseline.get(label, 0.0)
        ratio = share / max(base, BASELINE_FLOOR)
        flag = ""
        if label in rule.labels and n >= rule.min_count and ratio >= rule.factor:
            drifted.append(label)
            flag = " **drift**"
        lines.append(f"| {label}{flag} | {n} | {share:.1%} | {base:.1%} | {ratio:.1f}x |")
    return drifted, "\n".join(lines)


def _drift(ev: PartitionEvidence, rule: DriftRule) -> CheckResult:
    counts = label_counts(ev)
    total = sum(counts.values())
    base_counts: dict[str, int | float] = {"labels": total}
    if ev.baseline is None:
        summary = f"no baseline ({ev.baseline_source}): nothing to compare"
        return CheckResult("label_drift", True, summary, base_counts)
    drifted, table = drifted_labels(counts, ev.baseline, rule)
    base_counts.update({"drifted_labels": len(drifted), "factor": rule.factor})
    summary = (
        f"no watched label over {rule.factor:g}x the {ev.baseline_source} baseline"
        if not drifted
        else f"{', '.join(drifted)} over {rule.factor:g}x the {ev.baseline_source} baseline"
    )
    return CheckResult("label_drift", not drifted, summary, base_counts, (), table)


def _stage_drift(ev: PartitionEvidence, bounds: CheckBounds) -> CheckResult:
    """The share of the partition's labels (of current texts) a cascade's first stage decided,
    against the gold set's share for the same rules."""
    name = "stage_drift"
    if ev.stage_share is None:
        return CheckResult(name, True, "not a cascade, or its decide rules have no sweep", {})
    first, gold = ev.stage_share
    v = ev.versions
    mine = [
        r
        for r in ev.results
        if r["key_version"] == v.key_version
        and r["model"] == v.model
        and ev.posts.get(str(r["post_id"])) == r["content_hash"]
    ]
    decided = sum(1 for r in mine if r["stage"] == first)
    share = decided / len(mine) if mine else 0.0
    counts: dict[str, Any] = {"labels": len(mine), "first_stage_decided": decided}
    counts.update({"share": round(share, 4), "gold_share": round(gold, 4)})
    if len(mine) < bounds.drift.min_count:
        return CheckResult(name, True, f"{len(mine)} label(s): too few to compare", counts)
    off = abs(share - gold)
    summary = (
        f"{first} decided {share:.1%} of {len(mine)} labels; the gold set {gold:.1%} "
        f"(allowed: {bounds.max_stage_share_drift:.0%} either way)"
    )
    return CheckResult(name, off <= bounds.max_stage_share_drift, summary, counts)


def agreement_result(pairs: Pairs, bounds: CheckBounds) -> CheckResult:
    """The model against moderators over a tenant's decided posts (tenant-wide, the same in
    each of its partitions): agreement, Cohen's kappa with their 95% intervals, a table per
    label; a warning when kappa is under ``min_kappa`` with at least the drift check's minimum
    count of posts."""
    name = "agreement"
    got = agreement(pairs)
    if not got.posts:
        return CheckResult(name, True, "no decisions yet", {"decided_posts": 0})
    counts: dict[str, int | float] = {"decided_posts": got.posts, "agreed": got.agreed}
    counts["agreement"] = round(got.observed or 0.0, 4)
    if got.observed_ci:
        counts.update(agreement_low=round(got.observed_ci[0], 4))
        counts.update(agreement_high=round(got.observed_ci[1], 4))
    kappa = got.kappa.value if got.kappa.value is not None else 0.0
    counts.update(kappa=round(kappa, 4), min_kappa=bounds.min_kappa)
    ci = got.kappa.ci
    if ci:
        counts.update(kappa_low=round(ci[0], 4), kappa_high=round(ci[1], 4))
    lines = ["| label | model | moderators | both | positive agreement | kappa (95% CI) |"]
    lines.append("|---|---:|---:|---:|---:|---:|")
    for x in got.per_label:
        pa = "-" if x.positive_agreement is None else f"{x.positive_agreement:.1%}"
        k = x.kappa
        kt = "-" if k.value is None else f"{k.value:.3f}"
        kt += f" ({k.ci[0]:.3f} to {k.ci[1]:.3f})" if k.ci else ""
        lines.append(f"| {x.label} | {x.model} | {x.human} | {x.both} | {pa} | {kt} |")
    interval = f" (95% CI {ci[0]:.3f} to {ci[1]:.3f})" if ci else ""
    summary = (
        f"kappa {kappa:.3f}{interval}, agreement {got.observed:.1%} over {got.posts} decided "
        f"post(s)"
    )
    if got.posts < bounds.drift.min_count:
        return CheckResult(name, True, f"{summary}: too few to judge", counts, (), "\n".join(lines))
    passed = kappa >= bounds.min_kappa
    if not passed:
        summary += f": under {bounds.min_kappa:g}"
    return CheckResult(name, passed, summary, counts, (), "\n".join(lines))
