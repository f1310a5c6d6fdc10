"""A previous classifier's results per post, read onto the policy's labels (pure):
``baseline import``.

A row gives the old classifier's ``label`` (a label of the policy), or its attribute scores:
columns named as the attributes (``TOXICITY``, ``INSULT``, ...), a ``scores`` object of
attribute -> score, or Perspective API's own response shape
(``attributeScores.TOXICITY.summaryScore.value``). Scores are read onto the labels by
thresholds (``--threshold ATTR=LABEL:0.8``, a mapping file): each attribute takes its band
with the highest threshold at or below its score; the highest-scoring attribute with a band
decides; equal scores go to the label of higher numeric severity, then to the label listed
first in the policy, as the ``openai-moderation`` dialect's mapping does. No attribute at or
above a threshold: the policy's ``none`` label.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.work.columns import ColumnMapError, parse_field_map
from backfill_assets.domain.yaml_positions import FileInvalid, FileProblem, parse_yaml, read_text

ATTRIBUTE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
# The fields a baseline row gives, and the columns ``--map`` may read them from.
FIELDS = ("tenant_id", "post_id", "label", "scores")
PERSPECTIVE = "attributeScores"
MAX_MAPPING_BYTES = 64 * 1024
MAX_SCORES = 64


class MappingError(ValueError):
    """A ``--threshold`` or ``--map`` that cannot be read, or names what the policy lacks."""


class MappingInvalid(FileInvalid):
    """A mapping file with problems, each with its line."""

    what = "mapping file"


@dataclass(frozen=True, slots=True)
class Band:
    """An attribute's score at or above ``threshold`` means ``label``."""

    attribute: str
    label: str
    threshold: float


@dataclass(frozen=True)
class ScoreMap:
    """The bands of every attribute read, checked against a policy."""

    bands: tuple[Band, ...]

    @property
    def attributes(self) -> tuple[str, ...]:
        """The attributes the bands name, in their order, once each."""
        return tuple(dict.fromkeys(b.attribute for b in self.bands))


@dataclass(frozen=True, slots=True)
class BaselineRow:
    """One post's baseline: the label it maps to, and the scores it came from (JSON text,
    ``None`` when the row gave a label)."""

    line: int
    tenant_id: str
    post_id: str
    label: str
    scores: str | None
    locator: str | None = None


def parse_threshold(spec: str) -> Band:
    """``TOXICITY=abuse:0.8``."""
    attribute, eq, rest = spec.partition("=")
    label, colon, number = rest.rpartition(":")
    if not eq or not colon:
        raise MappingError(f"{spec[:60]!r}: expected ATTRIBUTE=LABEL:THRESHOLD")
    return _band(attribute.strip(), label.strip(), number.strip())


def _band(attribute: str, label: Any, number: Any) -> Band:
    if not ATTRIBUTE_RE.fullmatch(attribute):
        raise MappingError(f"attribute {attribute[:60]!r} must match {ATTRIBUTE_RE.pattern}")
    if not isinstance(label, str) or not label:
        raise MappingError(f"{attribute}: the label must be a label id")
    value = _number(number)
    if value is None or not 0.0 < value <= 1.0:
        raise MappingError(f"{attribute}={label}: the threshold must be a number in (0, 1]")
    return Band(attribute, label, value)


def read_mapping(path: str) -> list[Band]:
    """A mapping file's bands: ``attributes:`` -> attribute -> label -> threshold."""
    text = read_text(path, MAX_MAPPING_BYTES)
    if isinstance(text, FileProblem):
        raise MappingInvalid(path, [text])
    parsed = parse_yaml(text, "the mapping", "an empty mapping file")
    if isinstance(parsed, FileProblem):
        raise MappingInvalid(path, [parsed])
    doc, tree = parsed
    problems = list(tree.problems)
    if (
        not isinstance(doc, dict)
        or set(doc) != {"attributes"}
        or not isinstance(doc["attributes"], dict)
    ):
        line, col = tree.where(())
        problems.append(FileProblem(line, col, "expected one key, attributes: a mapping"))
        raise MappingInvalid(path, problems)
    bands: list[Band] = []
    for attribute, labels in doc["attributes"].items():
        line, col = tree.where(("attributes", attribute), key=True)
        if not isinstance(labels, dict) or not labels:
            problems.append(FileProblem(line, col, f"{attribute}: expected LABEL: THRESHOLD"))
            continue
        for label, number in labels.items():
            try:
                bands.append(_band(attribute, label, number))
            except MappingError as exc:
                at = tree.where(("attributes", attribute, label))
                problems.append(FileProblem(at[0], at[1], str(exc)))
    if problems:
        raise MappingInvalid(path, problems)
    return bands


def score_map(bands: Iterable[Band], policy: Policy) -> ScoreMap | None:
    """The bands checked against ``policy``: known labels, never its ``none`` label, one band
    per attribute and label. ``None`` when there are no bands (rows must give labels)."""
    out: list[Band] = []
    seen: set[tuple[str, str]] = set()
    for band in bands:
        if band.label not in policy.label_ids:
            known = ", ".join(policy.label_ids)
            raise MappingError(
                f"{band.attribute}: label {band.label[:40]!r} is not in policy "
                f"{policy.policy_id}@{policy.version} (labels: {known})"
            )
        if band.label == policy.none_label:
            raise MappingError(
                f"{band.attribute}: {band.label} is the policy's none label, what no band means"
            )
        if (band.attribute, band.label) in seen:
            raise MappingError(f"{band.attribute}: label {band.label} has two thresholds")
        seen.add((band.attribute, band.label))
        out.append(band)
    return ScoreMap(tuple(out)) if out else None


def parse_columns(spec: str | None) -> dict[str, str]:
    """``--map tenant_id=workspace,post_id=id,label=old_label``: field -> column."""
    try:
        return parse_field_map(spec, FIELDS)
    except ColumnMapError as exc:
        raise MappingError(str(exc)) from None


def _number(value: Any) -> float | None:
    """A score as a float: a JSON number, or the text of one (CSV); else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _score(name: str, value: Any) -> float:
    got = _number(value)
    if got is None or math.isnan(got) or not 0.0 <= got <= 1.0:
        raise ValueError(f"score of {name[:40]!r} is not a number in [0, 1]")
    return got


def _perspective(given: Any) -> dict[str, Any]:
    """Perspective's ``attributeScores``: each attribute's ``summaryScore.value``."""
    if not isinstance(given, dict):
        raise ValueError(f"{PERSPECTIVE} must be an object")
    out: dict[str, Any] = {}
    for name, body in given.items():
        summary = body.get("summaryScore") if isinstance(body, dict) else None
        if not isinstance(summary, dict) or "value" not in summary:
            raise ValueError(f"{PERSPECTIVE}.{str(name)[:40]}: no summaryScore.value")
        out[str(name)] = summary["value"]
    return out


def row_scores(values: Mapping[str, Any], scores_column: str, smap: ScoreMap) -> dict[str, float]:
    """The attribute scores a row gives (``ValueError`` with the reason otherwise): Perspective's
    shape, a ``scores`` object (or its JSON text), else the attributes' own columns. Every
    score given must be a number in [0, 1]; at least one mapped attribute must have one."""
    raw: Any = None
    if values.get(PERSPECTIVE) is not None:
        raw = _perspective(values[PERSPECTIVE])
    elif values.get(scores_column) not in (None, ""):
        raw = values[scores_column]
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except (ValueError, RecursionError):
                raise ValueError(f"{scores_column} is not a JSON object") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{scores_column} must be an object of attribute scores")
    else:
        raw = {a: values[a] for a in smap.attributes if values.get(a) not in (None, "")}
    if len(raw) > MAX_SCORES:
        raise ValueError(f"more than {MAX_SCORES} attribute scores")
    scores = {str(name): _score(str(name), value) for name, value in raw.items()}
    if not any(a in scores for a in smap.attributes):
        raise ValueError(f"no score for any mapped attribute ({', '.join(smap.attributes)})")
    return scores


def _severity_rank(policy: Policy) -> dict[str, tuple[float, int]]:
    """Label -> sort key: higher numeric severity first, then the policy's order."""
    rank: dict[str, tuple[float, int]] = {}
    for i, label in enumerate(policy.doc.labels):
        sev = label.severity
        numeric = float(sev) if isinstance(sev, int) and not isinstance(sev, bool) else None
        rank[label.id] = (-numeric if numeric is not None else math.inf, i)
    return rank


def label_for(scores: Mapping[str, float], smap: ScoreMap, policy: Policy) -> str:
    """The label ``scores`` map to under ``smap`` (see the module's doc)."""
    best: dict[str, Band] = {}
    for band in smap.bands:
        score = scores.get(band.attribute)
        if score is None or score < band.threshold:
            continue
        held = best.get(band.attribute)
        if held is None or band.threshold > held.threshold:
            best[band.attribute] = band
    if not best:
        return policy.none_label
    rank = _severity_rank(policy)
    decider = min(best.values(), key=lambda b: (-scores[b.attribute], rank[b.label]))
    return decider.label


def scores_json(scores: Mapping[str, float]) -> str:
    """Scores as stored: sorted, compact JSON."""
    return json.dumps(dict(sorted(scores.items())), separators=(",", ":"))


def acting(policy: Policy, labels: Sequence[str]) -> tuple[list[str], list[str]]:
    """``labels`` split into those whose action is ``none`` and those acted on (hidden,
    reviewed, ...); a label the policy lacks is in neither."""
    action = {label.id: label.action for label in policy.doc.labels}
    passes = [label for label in labels if action.get(label) == "none"]
    acts = [label for label in labels if label in action and action[label] != "none"]
    return passes, acts
