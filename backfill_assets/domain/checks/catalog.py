"""What the partition checks are: each check, whether its failure blocks the apply, the group
Dagster reports them in, and a check result's shape (the rules: ``check_rules.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from backfill_assets.domain.work.keys import slice_key


@dataclass(frozen=True, slots=True)
class CheckDef:
    """A check's name, whether its failure blocks applied_labels, and what it promises."""

    name: str
    blocking: bool
    warn: bool
    description: str


CHECKS: tuple[CheckDef, ...] = (
    CheckDef(
        "isolation",
        True,
        False,
        "Every results, ledger and dead-letter row of the partition carries its tenant, its "
        "slice is slice_of(tenant, post), and its key recomputes from that tenant's post: its "
        "current text, or an older text the ledger's attempts show was sent (stale).",
    ),
    CheckDef(
        "no_duplicates",
        True,
        False,
        "One result per key and per (post, text, versions); no key both accepted and "
        "dead-lettered. Counted in Python, not trusted to the primary key.",
    ),
    CheckDef(
        "coverage",
        True,
        False,
        "Every expected key (recomputed from the posts) is accepted or dead-lettered.",
    ),
    CheckDef(
        "output_schema",
        True,
        False,
        "The partition's stored results pass the pandera schema built from the policy (its "
        "labels, and rule ids of the label they name), confidence in [0, 1], well-formed keys. "
        "Blocking: applied labels reach the posts table.",
    ),
    CheckDef(
        "billed_within_bound",
        True,
        False,
        "No call was billed past the upper bound reserved for it (more tokens than any "
        "byte-level tokenizer can count: the budget cap could not be kept, and the tenant was "
        "stopped). Blocking: such a partition needs an operator's look before its labels are "
        "applied; BACKFILL_CHECK_MAX_OVER_BOUND_CALLS allows a number of them.",
    ),
    CheckDef(
        "spend",
        False,
        False,
        "Rebilled tokens, orphan attempts and tokens per key are within the configured bounds.",
    ),
    CheckDef(
        "label_drift",
        False,
        True,
        "Watched label shares (the policy's labels whose action is not none, unless "
        "configured) stay under factor x the baseline (configured or live shares).",
    ),
    CheckDef(
        "stage_drift",
        False,
        True,
        "A cascade's first stage decided about the share of the partition's labels that the "
        "gold set's threshold sweep found for the same decide rules (within "
        "BACKFILL_CHECK_MAX_STAGE_SHARE_DRIFT): if not, the gold set no longer looks like the "
        "archive, and its cost and quality figures do not hold here.",
    ),
    CheckDef(
        "agreement",
        False,
        True,
        "Cohen's kappa between the model's labels and moderators' decisions over the tenant's "
        "decided posts under the policy version in force reaches BACKFILL_CHECK_MIN_KAPPA; "
        "agreement and kappa with 95% intervals and a table per label. Passes with no "
        "decisions yet.",
    ),
)
CHECK_NAMES = tuple(c.name for c in CHECKS)
BLOCKING_CHECKS = tuple(c.name for c in CHECKS if c.blocking)
_BY_NAME = {c.name: c for c in CHECKS}


@dataclass(frozen=True, slots=True)
class CheckGroup:
    """Checks reported to Dagster as one evaluation per partition.

    Every evaluation is an event the instance writes and indexes, and a small tenant's
    partition holds a handful of posts: at 10,000 one-partition tenants a second group took
    ~10% of the run. So all nine checks are one evaluation; its metadata says which member
    failed and why, and its ``blocking`` flag and severity follow the members that failed
    (``GroupResult``): only a failed blocking member keeps ``applied_labels`` out.
    """

    name: str
    blocking: bool
    members: tuple[str, ...]
    description: str


# One group, under the name the blocking checks had when spend and drift were a second group
# (``spend_and_drift``): the evaluations an instance already holds for it stay current.
CHECK_GROUPS: tuple[CheckGroup, ...] = (
    CheckGroup(
        "integrity",
        True,
        CHECK_NAMES,
        "Every check of the partition. Blocks applied_labels when a blocking member fails: "
        "isolation (every row carries its tenant, its slice and a key that recomputes from "
        "that tenant's post), no_duplicates, coverage (every expected key accepted or "
        "dead-lettered), output_schema (pandera) and billed_within_bound (no call billed past "
        "the bound reserved for it). spend (rebilled tokens, orphan attempts and tokens per "
        "key within bounds: an error), label_drift (watched label shares under factor x "
        "the baseline), stage_drift and agreement (kappa between the model and moderators: "
        "warnings) are reported and never block.",
    ),
)


@dataclass(frozen=True)
class CheckResult:
    """One check's result for one partition."""

    name: str
    passed: bool
    summary: str
    counts: dict[str, int | float] = field(default_factory=dict)
    sample_keys: tuple[str, ...] = ()
    table: str | None = None
    inspect: str = ""

    @property
    def blocking(self) -> bool:
        """Whether a failure stops applied_labels."""
        return _BY_NAME[self.name].blocking

    @property
    def warn(self) -> bool:
        """Whether a failure is a warning rather than an error."""
        return _BY_NAME[self.name].warn


def inspect_command(tenant: str, slice_no: int, name: str) -> str:
    """The command that lists a check's offending rows."""
    return (
        f"backfill-moderation check --tenant {tenant} --slice {slice_key(slice_no)} --name {name}"
    )


@dataclass(frozen=True)
class GroupResult:
    """A check group's result for one partition, with its members' check results."""

    group: CheckGroup
    members: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        """All members passed."""
        return all(v.passed for v in self.members)

    @property
    def failed(self) -> list[CheckResult]:
        """The members that failed."""
        return [v for v in self.members if not v.passed]

    @property
    def blocks(self) -> bool:
        """A blocking member failed: the evaluation keeps ``applied_labels`` out."""
        return any(v.blocking for v in self.failed)

    @property
    def warn_only(self) -> bool:
        """Only warning-level members failed (a WARN evaluation, which never gates)."""
        return all(v.warn for v in self.failed)

    @property
    def summary(self) -> str:
        """One line: what failed, or that everything passed."""
        if self.passed:
            return f"{len(self.members)} check(s) passed"
        return "; ".join(f"{v.name}: {v.summary}" for v in self.failed)


def group_results(check_results: Iterable[CheckResult]) -> list[GroupResult]:
    """The check results of one partition, gathered into the check groups (in group order)."""
    by_name = {v.name: v for v in check_results}
    return [
        GroupResult(g, tuple(by_name[m] for m in g.members if m in by_name))
        for g in CHECK_GROUPS
        if any(m in by_name for m in g.members)
    ]


def blocking_failures(check_results: Iterable[CheckResult]) -> list[str]:
    """Names of the failed blocking checks."""
    return [v.name for v in check_results if v.blocking and not v.passed]
