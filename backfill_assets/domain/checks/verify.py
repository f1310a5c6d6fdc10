"""The independent check: recompute every key from the posts alone and check every row (pure).

Shared by ``backfill-moderation verify`` and the asset checks. Works on any scope (a tenant or
one partition): the caller passes that scope's posts and every row that claims to be in it.

Isolation: what a results or dead-letter row must be to belong to tenant T
--------------------------------------------------------------------------
Nothing the row says about itself is trusted. Its slice and key are recomputed:

1. ``tenant_id`` is T;
2. ``slice`` is ``keys.slice_of(T, post_id)`` (a row filed in another slice fails, wherever it
   is found), and ``post_id`` is a post of T;
3. either the row is **current**: its ``content_hash`` is the post's current hash in ``posts``
   and its key is ``work_key(row versions, T, post_id, that hash)``;
4. or it is **stale**, a result for an older text of an edited post: its key is
   ``work_key(row versions, T, post_id, row content_hash)``, that hash is not the current one,
   and the ledger holds an ``attempt`` of T for that very key, post and hash (written before
   the call, so it shows that text was sent). Stale rows are counted (``stale``) and never as
   done: the current text's key is still expected.

Anything else is an isolation failure, including a row whose ``content_hash`` was rewritten so
that its key recomputes from its own columns: that hash is not the post's, and no attempt ever
sent it. The evidence for a stale row is the ledger's attempt row; a forger who rewrites a
result *and* inserts a matching attempt passes rule 4, as nothing else records old texts.
Ledger ``attempt`` rows are checked by rules 1-2 and must derive from their own hash (they are
the evidence); usage and error events must point at an attempt of T with the same key.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from backfill_assets.domain.work.events import EventKind
from backfill_assets.domain.work.keys import Versions, slice_of, work_key

Row = Mapping[str, Any]
# usage_rollup: the invoice's figures (sql/008) disagree with the ledger they sum.
BLOCKING_KINDS = ("isolation", "duplicate", "usage_rollup")


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding; ``key`` and ids only, never post text."""

    kind: str
    tenant: str
    table: str
    key: str
    detail: str


@dataclass
class ScopeReport:
    """Per-tenant (or per-partition) figures, in the shape ``verify --json`` prints."""

    tenant: str
    expected: int = 0
    done: int = 0
    dead: int = 0
    missing: int = 0
    billed_tokens: int = 0
    rebilled_tokens: int = 0
    orphan_attempts: int = 0
    # Results for an older text of an edited post (see the module docstring); not done.
    stale: int = 0
    # Usage events booked at the call's bound because the provider reported none, and calls
    # billed past the bound reserved for them (the tenant was stopped; never expected).
    usage_missing: int = 0
    over_bound: int = 0
    # A tenant that holds gold sets (``evaluate``): audited like any, but its posts are
    # labelled under whichever policy was evaluated, so "complete" does not apply to it.
    evaluation: bool = False
    dead_by_outcome: dict[str, int] = field(default_factory=dict)
    missing_keys: list[str] = field(default_factory=list)
    # Samples for the spend check's metadata (keys only).
    rebilled_keys: list[str] = field(default_factory=list)
    orphan_keys: list[str] = field(default_factory=list)

    def absorb(self, part: ScopeReport, sample: int = 5) -> None:
        """Add the figures of ``part``, another share of the same scope's posts (``verify``
        audits a tenant in chunks of posts; every row belongs to its post's chunk, so the sum
        is what the whole scope gives, and so are the samples: the smallest keys)."""
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(part, name))
        self.dead_by_outcome = dict(Counter(self.dead_by_outcome) + Counter(part.dead_by_outcome))
        for name in ("missing_keys", "rebilled_keys", "orphan_keys"):
            setattr(self, name, sorted([*getattr(self, name), *getattr(part, name)])[:sample])

    def as_dict(self) -> dict[str, Any]:
        """JSON form (without the key samples)."""
        out = asdict(self)
        for sample in ("missing_keys", "rebilled_keys", "orphan_keys"):
            out.pop(sample)
        return out


# The report's counts, each the sum of its chunks' (``absorb``): every int field, so a count
# added to ScopeReport is added up without a second list to keep in step.
_COUNTS = tuple(f.name for f in fields(ScopeReport) if f.type == "int")

Sent = Mapping[str, set[tuple[str, str]]]


class _Derivation:
    """Recomputes what a row of ``tenant`` must be, each post's slice and current key once.

    Most rows are current (the scope's versions and the post's current hash): their key is
    looked up among the expected keys, computed once per post, instead of hashed per row.
    """

    def __init__(
        self,
        tenant: str,
        posts: Mapping[str, str],
        versions: Versions,
        expected: Mapping[str, str],
    ) -> None:
        self.tenant = tenant
        self.posts = posts
        self.versions = versions
        self._triple = (versions.task_version, versions.key_version, versions.model)
        self._expected = expected
        self._home: dict[str, int] = {}

    def home(self, post_id: str) -> int:
        got = self._home.get(post_id)
        if got is None:
            got = self._home[post_id] = slice_of(self.tenant, post_id)
        return got

    def key(self, row: Row, post_id: str, row_hash: str) -> str:
        triple = (str(row["task_version"]), str(row["key_version"]), str(row["model"]))
        if triple == self._triple and self.posts.get(post_id) == row_hash:
            known = self._expected.get(post_id)
            if known is not None:
                return known
        return work_key(Versions(*triple), self.tenant, post_id, row_hash)

    def why_not(self, row: Row, sent: Sent | None) -> str | None:
        """Why a row does not belong to the tenant, or None (see the module docstring).

        ``sent``: key -> {(post_id, content_hash)} of the tenant's attempts; None for an
        attempt row itself, which must only derive from its own content hash.
        """
        tenant = self.tenant
        if row["tenant_id"] != tenant:
            return f"row tenant {row['tenant_id']!r} is not {tenant!r}"
        post_id = row["post_id"]
        if post_id is None:
            return "row names no post"
        post_id = str(post_id)
        home = self.home(post_id)
        if row["slice"] != home:
            return f"row filed in slice {row['slice']!r}; its post belongs to slice {home}"
        if post_id not in self.posts:
            return "post does not exist for this tenant"
        row_hash = str(row["content_hash"])
        if self.key(row, post_id, row_hash) != row["key"]:
            return "key does not recompute from the tenant's post and the row's versions"
        if sent is None or row_hash == self.posts[post_id]:
            return None
        if (post_id, row_hash) not in sent.get(str(row["key"]), ()):
            return "content hash is not the post's text, and no attempt of this tenant sent it"
        return None


def _is_stale(row: Row, posts: Mapping[str, str]) -> bool:
    return posts.get(str(row["post_id"])) != str(row["content_hash"])


def _sent(tenant: str, ledger: Iterable[Row]) -> dict[str, set[tuple[str, str]]]:
    out: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for ev in ledger:
        if ev["type"] == EventKind.ATTEMPT and ev["tenant_id"] == tenant:
            out[str(ev["key"])].add((str(ev["post_id"]), str(ev["content_hash"])))
    return out


def verify_scope(
    tenant: str,
    posts: Mapping[str, str],
    results: Iterable[Row],
    dead: Iterable[Row],
    ledger: Iterable[Row],
    versions: Versions,
    sample: int = 5,
    expected_keys: Mapping[str, str] | None = None,
) -> tuple[ScopeReport, list[Problem]]:
    """Audit one tenant's scope.

    ``posts`` (post_id -> current content hash) defines the expected keys and is every post a
    row of the scope may derive from (a row's post is in its own scope: a partition holds its
    posts' slices, and ``verify``'s chunks of a tenant hold all of their posts' rows).
    ``expected_keys`` (post_id -> key under ``versions``) saves recomputing them when the
    caller has; they must be ``work_key(versions, tenant, post_id, posts[post_id])``.
    """
    rep = ScopeReport(tenant=tenant)
    ledger = list(ledger)
    sent = _sent(tenant, ledger)
    problems: list[Problem] = []
    by_post = (
        expected_keys
        if expected_keys is not None
        else {pid: work_key(versions, tenant, pid, h) for pid, h in posts.items()}
    )
    derive = _Derivation(tenant, posts, versions, by_post)
    expected = set(by_post.values())
    rep.expected = len(expected)

    result_keys: Counter[str] = Counter()
    per_post: Counter[tuple[str, ...]] = Counter()
    for row in results:
        result_keys[row["key"]] += 1
        per_post[
            (
                str(row["post_id"]),
                str(row["content_hash"]),
                str(row["task_version"]),
                str(row["key_version"]),
                str(row["model"]),
            )
        ] += 1
        why = derive.why_not(row, sent)
        if why:
            problems.append(Problem("isolation", tenant, "results", row["key"], why))
        elif _is_stale(row, posts):
            rep.stale += 1
    for key, n in result_keys.items():
        if n > 1:
            problems.append(Problem("duplicate", tenant, "results", key, f"{n} result rows"))
    for ident, n in per_post.items():
        if n > 1:
            problems.append(
                Problem("duplicate", tenant, "results", "", f"{n} results for post {ident[0]!r}")
            )

    dead_keys: dict[str, str] = {}
    for row in dead:
        why = derive.why_not(row, sent)
        if why:
            problems.append(Problem("isolation", tenant, "dead_letters", row["key"], why))
        if row["key"] in result_keys:
            problems.append(
                Problem(
                    "duplicate",
                    tenant,
                    "dead_letters",
                    row["key"],
                    "key is both accepted and dead-lettered",
                )
            )
        dead_keys[row["key"]] = str(row["outcome"])

    done = expected & set(result_keys)
    dead_in_scope = {k: o for k, o in dead_keys.items() if k in expected and k not in result_keys}
    missing = expected - done - set(dead_in_scope)
    rep.done, rep.dead, rep.missing = len(done), len(dead_in_scope), len(missing)
    rep.dead_by_outcome = dict(Counter(dead_in_scope.values()))
    rep.missing_keys = sorted(missing)[:sample]

    _check_ledger(tenant, derive, ledger, rep, problems, sample)
    return rep, problems


def _check_ledger(
    tenant: str,
    derive: _Derivation,
    ledger: Iterable[Row],
    rep: ScopeReport,
    problems: list[Problem],
    sample: int,
) -> None:
    attempts: dict[str, str] = {}
    answered: dict[str, str] = {}
    usage_by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for ev in ledger:
        kind = ev["type"]
        if kind == EventKind.ATTEMPT:
            why = derive.why_not(ev, None)
            if why:
                problems.append(Problem("isolation", tenant, "ledger_events", ev["key"], why))
            attempts[ev["attempt_id"]] = ev["key"]
            continue
        if ev["tenant_id"] != tenant:
            problems.append(
                Problem(
                    "isolation",
                    tenant,
                    "ledger_events",
                    ev["key"],
                    f"row tenant {ev['tenant_id']!r}",
                )
            )
        answered[ev["attempt_id"]] = str(ev["key"])
        if kind == EventKind.USAGE:
            tokens = int(ev["tokens_in"]) + int(ev["tokens_out"])
            rep.billed_tokens += tokens
            usage_by_key[ev["key"]].append((int(ev["id"]), tokens))
            if ev["usage_shape"] == "missing":
                rep.usage_missing += 1
            bound = ev["bound_tokens"]
            if bound is not None and tokens > int(bound):
                rep.over_bound += 1
                detail = f"billed {tokens} tokens > reserved bound {int(bound)}"
                problems.append(Problem("over_bound", tenant, "ledger_events", ev["key"], detail))
    for ev_attempt, key in answered.items():
        if ev_attempt not in attempts:
            why = "event without an attempt of this tenant"
        elif attempts[ev_attempt] != key:
            why = "event key differs from its attempt's key"
        else:
            continue
        problems.append(Problem("isolation", tenant, "ledger_events", ev_attempt, why))
    orphans = sorted({k for a, k in attempts.items() if a not in answered})
    rep.orphan_attempts = sum(1 for a in attempts if a not in answered)
    rep.orphan_keys = orphans[:sample]
    for key, usages in sorted(usage_by_key.items()):
        usages.sort()
        rep.rebilled_tokens += sum(t for _, t in usages[1:])
        if len(usages) > 1 and len(rep.rebilled_keys) < sample:
            rep.rebilled_keys.append(key)


Booked = dict[str, list[int]]


def book_usage(booked: Booked, tenant: str, ledger: Iterable[Row]) -> None:
    """Add the usage events of ``ledger`` (calls, tokens in, tokens out per model) to
    ``booked``: what ``usage_rollup_problems`` compares with the rollup."""
    for ev in ledger:
        if ev["type"] == EventKind.USAGE and ev["tenant_id"] == tenant:
            sums = booked.setdefault(str(ev["model"]), [0, 0, 0])
            sums[0] += 1
            sums[1] += int(ev["tokens_in"])
            sums[2] += int(ev["tokens_out"])


def usage_rollup_problems(
    tenant: str, booked: Booked, rollup: Mapping[str, tuple[int, int, int]]
) -> list[Problem]:
    """The usage rollup (calls, tokens in, tokens out per model) against the usage events of
    the tenant's ledger (``book_usage``): reports and invoices read the rollup, so they must
    agree exactly."""
    problems = []
    for model in sorted(set(booked) | set(rollup)):
        ledger_sums = tuple(booked.get(model, (0, 0, 0)))
        rolled = tuple(rollup.get(model, (0, 0, 0)))
        if ledger_sums != rolled:
            detail = (
                f"model {model}: ledger calls/tokens_in/tokens_out {ledger_sums},"
                f" usage_daily {rolled}"
            )
            problems.append(Problem("usage_rollup", tenant, "usage_daily", "", detail))
    return problems
