"""The pandera schemas and their checks (imported by ``validation`` on first use: pandas and
pandera take seconds to import, and a CLI call with nothing to validate should not pay).

The label set and the rules are the policy's: the frame models fix the columns, and each
output contract adds its own checks (``result_schema``, ``stored_schema``), built once.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pandas as pd
import pandera.pandas as pa
from pandera.engines import pandas_engine
from pandera.typing import Series

from backfill_assets.domain.policy.document import ITEM_ID_RE
from backfill_assets.domain.policy.output_gate import SCHEMA_VERSION, OutputContract
from backfill_assets.domain.work.keys import TENANT_ID_RE, Versions

# Rule ids as stored: comma-joined ids ("" for none).
RULE_IDS_RE = rf"^({ITEM_ID_RE.pattern[1:-1]}(,{ITEM_ID_RE.pattern[1:-1]})*)?$"

# A row to validate: its type is kept, so a typed row comes back typed.
R = TypeVar("R", bound=Mapping[str, Any])


def split_rule_ids(stored: str) -> tuple[str, ...]:
    """The ids of a stored ``rule_ids`` value."""
    return tuple(stored.split(",")) if stored else ()


class ResultFrame(pa.DataFrameModel):
    """Accepted results about to be written; one row per key."""

    key: Series[str] = pa.Field(
        str_matches=r"^[0-9a-f]{64}$", unique=True, description="Stable work key (sha256 hex)."
    )
    correlation_id: Series[str] = pa.Field(description="Key echoed by the model.")
    tenant_id: Series[str] = pa.Field(
        str_matches=TENANT_ID_RE.pattern, description="Tenant that owns the post."
    )
    post_id: Series[str] = pa.Field(str_length={"min_value": 1}, description="Post id.")
    label: Series[str] = pa.Field(
        str_matches=ITEM_ID_RE.pattern, description="A label of the policy (checked per contract)."
    )
    rule_ids: Series[str] = pa.Field(
        str_matches=RULE_IDS_RE, description="Comma-joined rule ids, each of that label."
    )
    confidence: Series[float] = pa.Field(ge=0.0, le=1.0, description="Confidence in [0, 1].")
    schema_version: Series[int] = pa.Field(
        isin=[SCHEMA_VERSION], description="Output contract version."
    )

    @pa.dataframe_check(description="The model answered the key it was sent.")
    def correlation_matches(cls, df: pd.DataFrame) -> Series[bool]:
        matches: Series[bool] = df["key"] == df["correlation_id"]
        return matches

    class Config:
        # split_valid builds the frame from exactly these columns: nothing to filter.
        strict = True
        coerce = False


def _is_str(column: pd.Series) -> bool | pd.Series:
    """True when the column holds strings; per element (the offending rows) when it does not.
    Missing values pass here: the column's ``nullable`` rule reports them."""
    if isinstance(column.dtype, pd.StringDtype):
        return True
    return column.map(
        lambda v: isinstance(v, str) or v is None or (isinstance(v, float) and v != v)
    )


def _cheap_string_types(schema: pa.DataFrameSchema) -> pa.DataFrameSchema:
    """The schema with each ``str`` dtype test replaced by the ``_is_str`` check.

    pandera 0.35 tests a ``str`` column element by element and formats the (empty) failure
    cases even when every element passes: about 1 ms per column per validation, a third of a
    small flush's check. ``_is_str`` is one dtype test when the column holds strings and the
    same per-row answer when it does not (pandas stores a mixed column as ``object``).
    """
    string = pandas_engine.Engine.dtype(str)
    return schema.update_columns(
        {
            name: {"dtype": None, "checks": [pa.Check(_is_str, name="is_str"), *col.checks]}
            for name, col in schema.columns.items()
            if col.dtype == string
        }
    )


_RESULT_BASE = _cheap_string_types(ResultFrame.to_schema())
_COLUMNS = list(_RESULT_BASE.columns)
# pandera loads its pandas backends (hypothesis strategies included, ~0.5 s) on the first
# validate: pay that at import, not inside the first flush of a run, where it holds the GIL
# and stalls the event loop.
_RESULT_BASE.register_default_backends(pd.DataFrame)


def _fits(contract: OutputContract, labels: pd.Series, rules: pd.Series) -> list[bool]:
    return [
        isinstance(lb, str)
        and isinstance(r, str)
        and contract.problem(lb, split_rule_ids(r)) is None
        for lb, r in zip(labels, rules, strict=True)
    ]


def _with_contract(
    base: pa.DataFrameSchema,
    contract: OutputContract,
    applies: Callable[[pd.DataFrame], pd.Series] | None = None,
) -> pa.DataFrameSchema:
    """``base`` plus the contract's checks: the label is one of the policy's, and every rule
    id is a rule of that label (and present where the label has rules). ``applies`` selects
    the rows the contract is for (the others pass: another policy version's results)."""

    def in_policy(df: pd.DataFrame) -> pd.Series:
        ok = df["label"].isin(list(contract.labels))
        return ok if applies is None else ok | ~applies(df)

    def rules_fit(df: pd.DataFrame) -> pd.Series:
        ok = pd.Series(_fits(contract, df["label"], df["rule_ids"]), index=df.index)
        return ok if applies is None else ok | ~applies(df)

    schema = copy.deepcopy(base)
    schema.checks = [
        *base.checks,
        pa.Check(in_policy, name="label_in_policy"),
        pa.Check(rules_fit, name="rules_fit_label"),
    ]
    return schema


@functools.lru_cache(maxsize=16)
def result_schema(contract: OutputContract) -> pa.DataFrameSchema:
    """The writer's frame check under one policy's contract."""
    return _with_contract(_RESULT_BASE, contract)


def _what(case: Any) -> str:
    # A frame-wide check reports every column of a failing row: name the row instead.
    if getattr(case, "schema_context", None) == "DataFrameSchema" or not case.column:
        return "row"
    return str(case.column)


def split_valid(rows: list[R], contract: OutputContract) -> tuple[list[R], list[tuple[R, str]]]:
    """Validate a batch; returns (valid rows, [(invalid row, reason)])."""
    if not rows:
        return [], []
    frame = pd.DataFrame({c: [r.get(c) for r in rows] for c in _COLUMNS})
    try:
        # In place: the frame is ours and is thrown away, so pandera need not copy it.
        result_schema(contract).validate(frame, lazy=True, inplace=True)
    except pa.errors.SchemaErrors as exc:
        bad: dict[int, str] = {}
        for case in exc.failure_cases.itertuples():
            idx = getattr(case, "index", None)
            reason = f"result frame: {_what(case)} failed {case.check}"
            if idx is None or pd.isna(idx):
                # A frame-wide failure (e.g. a wrong dtype) taints every row of the batch.
                return [], [(r, reason) for r in rows]
            bad.setdefault(int(idx), reason)
        good = [r for i, r in enumerate(rows) if i not in bad]
        return good, [(rows[i], reason) for i, reason in sorted(bad.items())]
    return rows, []


@functools.lru_cache(maxsize=16)
def warm_up(contract: OutputContract) -> None:
    """Validate one synthetic row, once per process.

    pandera's first validation imports and builds its checks (about a second on a busy
    machine) and holds the GIL meanwhile; done inside the first flush, it stalls the event
    loop while calls are in flight, and a crash then loses a longer flush window.
    """
    key = "0" * 64
    row = {
        "key": key,
        "correlation_id": key,
        "tenant_id": "warm-up",
        "post_id": "warm-up",
        "label": contract.none_label,
        "rule_ids": "",
        "confidence": 0.5,
        "schema_version": SCHEMA_VERSION,
    }
    good, bad = split_valid([row], contract)
    if bad or len(good) != 1:  # the schema itself would be broken
        raise RuntimeError(f"result schema rejects a valid row: {bad}")


class StoredResultFrame(pa.DataFrameModel):
    """Result rows as stored: what ``output_schema`` checks over a partition."""

    key: Series[str] = pa.Field(
        str_matches=r"^[0-9a-f]{64}$", unique=True, description="Stable work key (sha256 hex)."
    )
    tenant_id: Series[str] = pa.Field(
        str_matches=TENANT_ID_RE.pattern, description="Tenant that owns the post."
    )
    post_id: Series[str] = pa.Field(str_length={"min_value": 1}, description="Post id.")
    content_hash: Series[str] = pa.Field(
        str_matches=r"^[0-9a-f]{64}$", description="sha256 of the NFC text the label is for."
    )
    label: Series[str] = pa.Field(
        str_matches=ITEM_ID_RE.pattern, description="A label (of its policy version)."
    )
    rule_ids: Series[str] = pa.Field(
        str_matches=RULE_IDS_RE, description="Comma-joined rule ids, each of that label."
    )
    confidence: Series[float] = pa.Field(ge=0.0, le=1.0, description="Confidence in [0, 1].")
    model: Series[str] = pa.Field(str_length={"min_value": 1}, description="Model version.")
    key_version: Series[str] = pa.Field(str_length={"min_value": 1}, description="Prompt version.")
    task_version: Series[str] = pa.Field(str_length={"min_value": 1}, description="Task version.")

    class Config:
        strict = "filter"
        coerce = False


_STORED_BASE = _cheap_string_types(StoredResultFrame.to_schema())
_STORED_COLUMNS = list(_STORED_BASE.columns)


@functools.lru_cache(maxsize=16)
def stored_schema(contract: OutputContract, versions: Versions) -> pa.DataFrameSchema:
    """The stored results' check: every row's shape, and the contract for the rows of
    ``versions`` (the policy in force). Rows of another policy version are that version's
    labels, checked by their own policy when it was in force."""
    triple = (versions.task_version, versions.key_version, versions.model)

    def current(df: pd.DataFrame) -> pd.Series:
        return (
            (df["task_version"] == triple[0])
            & (df["key_version"] == triple[1])
            & (df["model"] == triple[2])
        )

    return _with_contract(_STORED_BASE, contract, current)


def stored_result_problems(
    rows: Sequence[Mapping[str, Any]], contract: OutputContract, versions: Versions
) -> list[tuple[str, str]]:
    """(key, reason) for every stored result row that fails the schema; [] when all pass."""
    if not rows:
        return []
    frame = pd.DataFrame({c: [r[c] for r in rows] for c in _STORED_COLUMNS})
    try:
        stored_schema(contract, versions).validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        found: dict[int, str] = {}
        for case in exc.failure_cases.itertuples():
            idx = getattr(case, "index", None)
            reason = f"{_what(case)} failed {case.check}"
            if idx is None or pd.isna(idx):
                return [(str(r["key"]), reason) for r in rows]
            found.setdefault(int(idx), reason)
        return [(str(rows[i]["key"]), why) for i, why in sorted(found.items())]
    return []
