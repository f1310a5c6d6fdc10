"""The pictures of ``evaluate --report`` from hand-made reports: valid PNGs, also for a report
with nothing to plot, and a model name that would be mathtext is drawn as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backfill_assets.defs.reporting import evaluation_pictures as pictures
from backfill_assets.domain.policy.calibration import calibration
from backfill_assets.domain.policy.evaluation import figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _report(expected: list[str], predicted: list[str | None], scores: list[float | None]) -> Any:
    fig = figures(expected, predicted, ["spam", "ok"])
    return {
        "policy": "p@1#0123456789abcdef",
        "model": r"m$\frac$x",  # unbalanced mathtext: a ValueError if parsed
        "rows": len(expected),
        "confusion": {e: dict(row) for e, row in fig.confusion.items()},
        "calibration": calibration(expected, predicted, scores, ["spam", "ok"]).as_dict(),
    }


@pytest.mark.parametrize(
    "rows",
    [
        (["spam", "ok", "ok", "spam"], ["spam", "ok", "spam", None], [0.9, 0.7, 1.0, None]),
        (["spam", "ok"], [None, None], [None, None]),  # nothing scored: empty panels
    ],
    ids=["scored", "nothing scored"],
)
def test_each_picture_is_a_png(rows: Any, tmp_path: Path) -> None:
    report = _report(*rows)
    for draw in (
        pictures.confusion_matrix,
        pictures.reliability_diagram,
        pictures.precision_recall,
    ):
        path = draw(report, tmp_path / f"{draw.__name__}.png")
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000, draw.__name__
