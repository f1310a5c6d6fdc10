"""``evaluate --report DIR``: an evaluation's pictures and ``calibration.json`` in a folder,
recorded on the evaluation so the ``policy_evaluation`` asset can link them.

matplotlib is imported only while the pictures are drawn (``evaluation_pictures``): every other
command, and ``evaluate`` without ``--report``, stays as light as before.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import dagster as dg
from sqlalchemy.engine import Engine

from backfill_assets.ledger import evaluations as evals
from backfill_assets.ledger.engine import write_tx

CONFUSION_PNG = "confusion_matrix.png"
RELIABILITY_PNG = "reliability.png"
PRECISION_RECALL_PNG = "precision_recall.png"
CALIBRATION_JSON = "calibration.json"
PICTURES = (CONFUSION_PNG, RELIABILITY_PNG, PRECISION_RECALL_PNG)
# evaluate --cascade: cost per 1,000 posts against macro-F1, every setting swept.
FRONTIER_PNG = "cascade_frontier.png"
# With --against, the baseline's report goes beside the policy's, in this subfolder.
AGAINST = "against"


class ReportDirError(ValueError):
    """``--report DIR`` names a folder that cannot be made or written."""


def check_report_dir(path: str | Path) -> Path:
    """``path`` made absolute, once it is known that it can be made and written: it is a folder
    or does not exist yet, and its nearest existing folder takes a file. Nothing is left
    behind: a refused command creates nothing it was pointed at."""
    folder = Path(path).expanduser().resolve()
    if folder.exists() and not folder.is_dir():
        raise ReportDirError(f"{folder} exists and is not a folder")
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise ReportDirError(f"{folder} cannot be made: {existing} is not a folder")
    try:
        # Permission bits alone do not say it (root ignores them, a file system may be
        # read-only): a file is made and removed.
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise ReportDirError(f"{folder} cannot be written: {exc.strerror or exc}") from None
    return folder


def write_report(
    engine: Engine, folder: Path, report: dict[str, Any], evaluation_id: int
) -> list[Path]:
    """Write one policy's report (its JSON form, as ``evaluate --json`` prints it) into
    ``folder`` and record the folder on its evaluation; returns the files written."""
    # Only here: drawing needs matplotlib, which nothing else loads.
    from backfill_assets.defs.reporting import evaluation_pictures as pictures

    try:
        folder.mkdir(parents=True, exist_ok=True)
        written = [
            pictures.confusion_matrix(report, folder / CONFUSION_PNG),
            pictures.reliability_diagram(report, folder / RELIABILITY_PNG),
            pictures.precision_recall(report, folder / PRECISION_RECALL_PNG),
        ]
        calibration = folder / CALIBRATION_JSON
        calibration.write_text(json.dumps(report["calibration"], indent=1) + "\n", "utf-8")
    except OSError as exc:
        raise ReportDirError(f"{folder} cannot be written: {exc.strerror or exc}") from None
    with write_tx(engine) as conn:
        evals.set_report_dir(conn, evaluation_id, str(folder))
    return [*written, calibration]


def write_frontier(folder: Path, sweep: dict[str, Any]) -> Path:
    """Draw a threshold sweep's settings, its frontier and the chosen setting into
    ``folder/cascade_frontier.png`` (``sweep``: the ``evaluate --cascade --json`` document)."""
    from backfill_assets.defs.reporting import evaluation_pictures as pictures

    try:
        folder.mkdir(parents=True, exist_ok=True)
        return pictures.cascade_frontier(sweep, folder / FRONTIER_PNG)
    except OSError as exc:
        raise ReportDirError(f"{folder} cannot be written: {exc.strerror or exc}") from None


def frontier_link(folder: str) -> dict[str, Any]:
    """``policy_evaluation``'s link to the latest sweep's picture, while it is there."""
    path = Path(folder) / FRONTIER_PNG
    if not path.is_file():
        return {}
    return {FRONTIER_PNG.replace(".", "_"): dg.MetadataValue.path(str(path))}


def report_links(folder: str) -> dict[str, Any]:
    """``policy_evaluation``'s links to a report: its folder, and its pictures and
    calibration.json that are still there (a report folder may be moved or cleaned since)."""
    md: dict[str, Any] = {"report_dir": dg.MetadataValue.path(folder)}
    for name in (*PICTURES, CALIBRATION_JSON):
        path = Path(folder) / name
        if path.is_file():
            md[name.replace(".", "_")] = dg.MetadataValue.path(str(path))
    return md
