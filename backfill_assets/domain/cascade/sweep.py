"""The threshold sweep of a cascade over a gold set (pure): every setting of the decide rules,
routed over the stages' stored answers, with what it decides, costs and scores. docs/cascade.md,
"Choosing thresholds: the optimiser".

Inputs are, per gold post, its expected label and each stage's stored answer: the label and
score (``stage_score``), or none (a dead letter; a *final* one, ``schema_rejected`` or
``transport_rejected``, passes the post on as in a run), and the nano-dollars the stage booked
for it. A setting gives each stage but the last a decide rule, or ``None``: the stage is *off*,
left out of the cascade (it decides nothing, and a post is not sent to it, so it costs nothing).
Each post is routed exactly as ``ledger/labels/cascade_routes.py`` routes it, by the same
``decides``; it pays each stage it meets, in exact integer nano-dollars.

The grid: 0.50 to 0.99 by 0.01, then 0.995 and 0.999, plus the file's own ``min_score`` and off.
With one thresholded stage, both ``when`` rules are tried (107 settings or fewer). With more,
each stage keeps the file's ``when``, and its values are off, its own and ``j`` spread evenly
over the grid, ``j`` the largest that keeps the product of the stages' choices at most
``MAX_SETTINGS`` (3,000): two thresholded stages get the whole grid (53 x 53 when the file's own
values are on it), three 14 choices each, seven 3.

Macro-F1 and accuracy are what ``domain/policy/evaluation.py``'s ``figures`` computes for the
setting's labels (``confusion_figures``, from their confusion matrix). The 95% interval of
macro-F1 is a percentile bootstrap over the gold rows: ``RESAMPLES`` resamples of n rows drawn
with replacement, each one's macro-F1 computed as ``figures`` does (the mean F1 over the labels
that occur in its expected or answered labels), the interval their 2.5th and 97.5th percentiles
(linear interpolation). Rows with the same (expected, answered) pair are interchangeable for
macro-F1, so a resample is drawn as multinomial counts of those pairs (the same distribution
as drawing rows, at a cost that does not grow with n), from numpy's PCG64 seeded with ``SEED``:
the same answers give the same interval on every run. ``measure.py`` measures every setting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from backfill_assets.domain.cascade.decide import ANY_LABEL, NONE_LABEL, WHENS, Decide, decides
from backfill_assets.domain.cascade.file import Cascade
from backfill_assets.domain.cascade.measure import OFF, GoldArrays, GoldPost, Setting, StageAnswer
from backfill_assets.domain.money.nanos import usd_text, whole_nanos

GRID: tuple[float, ...] = (*(round(0.5 + k / 100, 2) for k in range(50)), 0.995, 0.999)
MAX_SETTINGS = 3_000


@dataclass(frozen=True, slots=True)
class Route:
    """Where a post ends under a setting: the stage whose answer is its label (or where it
    stopped without one), that label, and what the stages it met cost."""

    stage: int
    label: str | None
    cost_nanos: int


def route(setting: Setting, answers: Sequence[StageAnswer], none_label: str) -> Route:
    """One post's way through the stages under ``setting``, as a run routes it."""
    last = len(answers) - 1
    cost = 0
    for k, got in enumerate(answers):
        rule = setting[k] if k < last else None
        if k < last and rule is OFF:
            continue
        cost += got.cost_nanos
        if got.label is not None:
            if k == last or decides(rule, got.label, got.score, none_label):
                return Route(k, got.label, cost)
            continue
        if got.passes and k < last:
            continue
        return Route(k, None, cost)
    raise ValueError("a cascade has at least one stage")


@dataclass(frozen=True)
class SettingFigures:
    """What one setting does on the gold set."""

    setting: Setting
    decided: tuple[int, ...]  # posts labelled by each stage, in the stages' order
    unlabelled: int  # posts left without a label (a dead letter on their way)
    cost_nanos: int  # every call the setting makes, over the gold posts
    rows: int
    accuracy: float
    macro_f1: float
    ci95: tuple[float, float]

    @property
    def cost_per_1000_nanos(self) -> int:
        """Nano-dollars per 1,000 posts, rounded once."""
        return whole_nanos(Decimal(self.cost_nanos) * 1000 / self.rows) if self.rows else 0

    def as_dict(self, names: Sequence[str]) -> dict[str, Any]:
        """JSON form; ``names``: the stages' names, in order."""
        share = (lambda n: n / self.rows) if self.rows else (lambda _n: 0.0)
        return {
            "setting": describe(self.setting, names),
            "rules": rules_doc(self.setting, names),
            "decided": {name: share(n) for name, n in zip(names, self.decided, strict=True)},
            "decided_posts": dict(zip(names, self.decided, strict=True)),
            "unlabelled": share(self.unlabelled),
            "cost_nanos": self.cost_nanos,
            "cost_per_1000_posts_usd": usd_text(self.cost_per_1000_nanos),
            "macro_f1": self.macro_f1,
            "macro_f1_ci95": list(self.ci95),
            "accuracy": self.accuracy,
        }


def rules_doc(setting: Setting, names: Sequence[str]) -> list[dict[str, Any]]:
    """Each stage but the last: its rule (``when``, ``min_score``; both null when it is off)."""
    return [
        {
            "stage": name,
            "when": None if rule is OFF else rule.when,
            "min_score": None if rule is OFF else rule.min_score,
        }
        for name, rule in zip(names, setting, strict=False)
    ]


def describe(setting: Setting, names: Sequence[str]) -> str:
    """``screen none_label>=0.97 > judge``: each stage's rule, off stages marked."""
    parts = [
        f"{name} off" if rule is OFF else f"{name} {rule.when}>={rule.min_score!r}"
        for name, rule in zip(names, setting, strict=False)
    ]
    return " > ".join([*parts, names[-1]])


def strictness(setting: Setting) -> tuple[tuple[int, int, float], ...]:
    """Ties of cost and macro-F1 go to the setting whose early stages decide least on the
    archive: off first, then ``none_label`` (a subset of ``any_label``), then the higher
    ``min_score`` (smaller sorts first)."""
    return tuple(
        (0, 0, 0.0) if rule is OFF else (1, WHENS.index(rule.when), -rule.min_score)
        for rule in setting
    )


def _order(f: SettingFigures) -> tuple[Any, ...]:
    return (f.cost_nanos, -f.macro_f1, strictness(f.setting))


def frontier(settings: Sequence[SettingFigures]) -> list[SettingFigures]:
    """The settings no other beats in both cost and macro-F1, cheapest first; of settings
    with the same cost and macro-F1, the strictest stands for them all."""
    out: list[SettingFigures] = []
    best = -math.inf
    for f in sorted(settings, key=_order):
        if f.macro_f1 > best:
            out.append(f)
            best = f.macro_f1
    return out


def choose(settings: Sequence[SettingFigures], target: float) -> SettingFigures | None:
    """The cheapest setting whose interval's lower bound reaches ``target`` (ties: the higher
    macro-F1, then the strictest); None when none does."""
    reaching = [f for f in settings if f.ci95[0] >= target]
    return min(reaching, key=_order) if reaching else None


def best_lower_bound(settings: Sequence[SettingFigures]) -> SettingFigures:
    """The setting with the highest lower bound (ties: the cheaper)."""
    return max(settings, key=lambda f: (f.ci95[0], -f.cost_nanos))


# ------------------------------------------------------------------------------------ the grid


def _spread(j: int) -> list[float]:
    """``j`` values spread evenly over the grid, its ends included from two on."""
    if j <= 0:
        return []
    if j == 1:
        return [GRID[-1]]
    last = len(GRID) - 1
    return sorted({GRID[round(i * last / (j - 1))] for i in range(j)})


def _choices(rule: Decide, values: Sequence[float], whens: Sequence[str]) -> list[Decide | None]:
    scores = sorted({*values, rule.min_score})
    return [OFF, *(Decide(w, v) for w in whens for v in scores)]


def settings_grid(own: Setting) -> list[Setting]:
    """The settings swept around the file's own rules ``own`` (module docstring), own first."""
    if not own:
        return [()]
    if any(rule is OFF for rule in own):
        raise ValueError("a file's stages but the last each have a decide rule")
    rules = [r for r in own if r is not OFF]
    if len(rules) == 1:
        other = ANY_LABEL if rules[0].when == NONE_LABEL else NONE_LABEL
        per_stage = [_choices(rules[0], GRID, (rules[0].when, other))]
    else:
        for j in range(len(GRID), -1, -1):
            per_stage = [_choices(r, _spread(j), (r.when,)) for r in rules]
            if math.prod(len(c) for c in per_stage) <= MAX_SETTINGS:
                break
    grid: list[Setting] = [own]
    seen = {own}

    def product(k: int, head: Setting) -> None:
        if k == len(per_stage):
            if head not in seen:
                seen.add(head)
                grid.append(head)
            return
        for choice in per_stage[k]:
            product(k + 1, (*head, choice))

    product(0, ())
    return grid


def with_setting(cascade: Cascade, setting: Setting) -> Cascade:
    """``cascade`` with ``setting``'s rules; an off stage is left out of it."""
    stages = [
        replace(stage, decide=setting[k] if k < len(setting) else None)
        for k, stage in enumerate(cascade.stages)
        if k >= len(setting) or setting[k] is not OFF
    ]
    return Cascade(tuple(stages))


# ----------------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Sweep:
    """Every setting's figures (the file's own first) and the frontier."""

    settings: list[SettingFigures]
    frontier: list[SettingFigures]

    @property
    def own(self) -> SettingFigures:
        """The file's own setting."""
        return self.settings[0]


def sweep(
    own: Setting, posts: Sequence[GoldPost], policy_labels: Sequence[str], none_label: str
) -> Sweep:
    """Every setting of the grid around ``own``, measured on ``posts``."""
    arrays = GoldArrays(posts, policy_labels, none_label)
    measured = []
    for setting in settings_grid(own):
        got = arrays.measure(setting)
        measured.append(
            SettingFigures(
                setting=setting,
                decided=got.decided,
                unlabelled=got.unlabelled,
                cost_nanos=got.cost_nanos,
                rows=len(posts),
                accuracy=got.accuracy,
                macro_f1=got.macro_f1,
                ci95=got.ci95,
            )
        )
    return Sweep(measured, frontier(measured))
