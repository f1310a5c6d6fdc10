"""The pandera frames behind ``validation`` (imported on first use: pandas and pandera take
seconds to import, and a CLI call with nothing to validate should not pay for them)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from .keys import TENANT_ID_RE
from .rubric import LABELS, SCHEMA_VERSION


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
    label: Series[str] = pa.Field(isin=list(LABELS), description="Label from the closed set.")
    confidence: Series[float] = pa.Field(ge=0.0, le=1.0, description="Confidence in [0, 1].")
    schema_version: Series[int] = pa.Field(
        isin=[SCHEMA_VERSION], description="Output contract version."
    )

    @pa.dataframe_check(description="The model answered the key it was sent.")
    def correlation_matches(cls, df: pd.DataFrame) -> Series[bool]:
        matches: Series[bool] = df["key"] == df["correlation_id"]
        return matches

    class Config:
        strict = "filter"
        coerce = False


RESULT_SCHEMA = ResultFrame.to_schema()
_COLUMNS = list(RESULT_SCHEMA.columns)


def split_valid(
    rows: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """Validate a batch; returns (valid rows, [(invalid row, reason)])."""
    if not rows:
        return [], []
    frame = pd.DataFrame({c: [r.get(c) for r in rows] for c in _COLUMNS})
    try:
        RESULT_SCHEMA.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        bad: dict[int, str] = {}
        for case in exc.failure_cases.itertuples():
            idx = getattr(case, "index", None)
            reason = f"result frame: {case.column or 'row'} failed {case.check}"
            if idx is None or pd.isna(idx):
                # A frame-wide failure (e.g. a wrong dtype) taints every row of the batch.
                return [], [(r, reason) for r in rows]
            bad.setdefault(int(idx), reason)
        good = [r for i, r in enumerate(rows) if i not in bad]
        return good, [(rows[i], reason) for i, reason in sorted(bad.items())]
    return rows, []


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
    label: Series[str] = pa.Field(isin=list(LABELS), description="Label from the closed set.")
    confidence: Series[float] = pa.Field(ge=0.0, le=1.0, description="Confidence in [0, 1].")
    model: Series[str] = pa.Field(str_length={"min_value": 1}, description="Model version.")
    prompt_version: Series[str] = pa.Field(
        str_length={"min_value": 1}, description="Prompt version."
    )
    task_version: Series[str] = pa.Field(str_length={"min_value": 1}, description="Task version.")

    class Config:
        strict = "filter"
        coerce = False


STORED_RESULT_SCHEMA = StoredResultFrame.to_schema()
_STORED_COLUMNS = list(STORED_RESULT_SCHEMA.columns)


def stored_result_problems(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(key, reason) for every stored result row that fails the schema; [] when all pass."""
    if not rows:
        return []
    frame = pd.DataFrame({c: [r.get(c) for r in rows] for c in _STORED_COLUMNS})
    try:
        STORED_RESULT_SCHEMA.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        found: dict[int, str] = {}
        for case in exc.failure_cases.itertuples():
            idx = getattr(case, "index", None)
            reason = f"{case.column or 'row'} failed {case.check}"
            if idx is None or pd.isna(idx):
                return [(str(r.get("key")), reason) for r in rows]
            found.setdefault(int(idx), reason)
        return [(str(rows[i].get("key")), why) for i, why in sorted(found.items())]
    return []
