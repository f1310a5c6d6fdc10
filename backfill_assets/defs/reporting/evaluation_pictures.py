"""The pictures of ``evaluate --report``, drawn from an evaluation's JSON report: the confusion
matrix, the reliability diagram (overall and per label) and the precision-recall curves; with
``--cascade``, the threshold sweep's cost against macro-F1.

Figures are made with matplotlib's object API and its Agg canvas, never ``pyplot``: no GUI
backend is chosen, no global figure state is kept, and nothing here needs a display. Titles
name the policy and the model as given, so they are not parsed as mathtext (a '$' is text).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 100


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", dpi=DPI)
    return path


def confusion_matrix(report: dict[str, Any], path: Path) -> Path:
    """Expected label (rows) x answered label (columns), each cell's count written in it."""
    rows: dict[str, dict[str, int]] = report["confusion"]
    expected = list(rows)
    answered = list(next(iter(rows.values()))) if rows else []
    counts = [[rows[e][a] for a in answered] for e in expected]
    fig = Figure(
        figsize=(2.5 + 0.9 * max(len(answered), 1), 1.8 + 0.6 * max(len(expected), 1)),
        layout="constrained",
    )
    ax = fig.add_subplot()
    top = max((n for row in counts for n in row), default=0)
    ax.imshow(counts or [[0]], cmap="Blues", vmin=0, vmax=max(top, 1), aspect="auto")
    for i, row in enumerate(counts):
        for j, n in enumerate(row):
            dark = n > top / 2
            ax.text(j, i, str(n), ha="center", va="center", color="white" if dark else "black")
    ax.set_xticks(range(len(answered)), answered, rotation=40, ha="right")
    ax.set_yticks(range(len(expected)), expected)
    ax.set_xlabel("answered")
    ax.set_ylabel("expected")
    ax.set_title(
        f"confusion on {report['rows']} gold rows\n{report['policy']} ({report['model']})",
        fontsize=10,
        parse_math=False,
    )
    return _save(fig, path)


def _reliability_panel(ax: Axes, name: str, part: dict[str, Any]) -> None:
    bins = part["reliability"]
    width = bins[0]["upper"] - bins[0]["lower"] if bins else 0.1
    full = [b for b in bins if b["count"]]
    ax.bar(
        [b["lower"] for b in full],
        [b["accuracy"] for b in full],
        width=width,
        align="edge",
        edgecolor="black",
        linewidth=0.5,
        label="accuracy",
    )
    ax.plot(
        [b["mean_score"] for b in full],
        [b["accuracy"] for b in full],
        "o",
        color="tab:orange",
        markersize=4,
        label="mean score",
    )
    ax.plot([0, 1], [0, 1], "--", color="grey", linewidth=1, label="calibrated")
    for b in full:
        ax.text(b["lower"] + width / 2, 1.02, str(b["count"]), ha="center", fontsize=7)
    ece = "-" if part["ece"] is None else f"{part['ece']:.3f}"
    ax.set_title(f"{name}: ECE {ece}, {part['rows']} rows", fontsize=9)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("score")
    ax.set_ylabel("accuracy")


def reliability_diagram(report: dict[str, Any], path: Path) -> Path:
    """Each bin's accuracy (bars, the bin's row count above) against the diagonal of a
    calibrated score; overall first, then each label the policy gave at least once."""
    cal = report["calibration"]
    panels = [("overall", cal["overall"])]
    panels += [(c["label"], c) for c in cal["labels"] if c["rows"]]
    cols = min(3, len(panels))
    lines = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(3.6 * cols, 3.2 * lines), layout="constrained")
    axes = fig.subplots(lines, cols, squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k < len(panels):
            _reliability_panel(ax, *panels[k])
        else:
            ax.set_axis_off()
    axes[0][0].legend(loc="upper left", fontsize=7)
    fig.suptitle(
        f"reliability (score: {cal['score']})\n{report['policy']}", fontsize=10, parse_math=False
    )
    return _save(fig, path)


def _points(pr: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(recall, precision) where both are defined."""
    pairs: Sequence[tuple[float | None, float | None]] = list(
        zip(pr["recall"], pr["precision"], strict=True)
    )
    kept = [(r, p) for r, p in pairs if r is not None and p is not None]
    return [r for r, _ in kept], [p for _, p in kept]


def precision_recall(report: dict[str, Any], path: Path) -> Path:
    """Each label's precision against its recall as the threshold falls from 1 to 0, and the
    overall (micro-averaged) curve dashed."""
    cal = report["calibration"]
    fig = Figure(figsize=(7, 5.5), layout="constrained")
    ax = fig.add_subplot()
    for c in cal["labels"]:
        recall, precision = _points(c["pr"])
        if recall:
            ax.plot(recall, precision, marker=".", markersize=3, label=c["label"])
    recall, precision = _points(cal["overall"]["pr"])
    if recall:
        ax.plot(recall, precision, "--", color="black", label="overall (micro)")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    # Two lines: a policy identity is long enough to run past the figure on one.
    ax.set_title(
        f"precision-recall (score: {cal['score']})\n{report['policy']}",
        fontsize=10,
        parse_math=False,
    )
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower left", fontsize=8)
    return _save(fig, path)


def _cost(setting: dict[str, Any]) -> float:
    return float(setting["cost_per_1000_posts_usd"])


def _errors(settings: Sequence[dict[str, Any]]) -> list[list[float]]:
    lows = [s["macro_f1"] - s["macro_f1_ci95"][0] for s in settings]
    highs = [s["macro_f1_ci95"][1] - s["macro_f1"] for s in settings]
    return [[max(0.0, x) for x in lows], [max(0.0, x) for x in highs]]


def cascade_frontier(sweep: dict[str, Any], path: Path) -> Path:
    """A threshold sweep: every setting's cost per 1,000 posts against its macro-F1 (grey),
    the frontier with its 95% intervals (a line, cheapest first), the file's own setting and
    the chosen one marked."""
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.add_subplot()
    every = sweep["settings"]
    ax.plot(
        [_cost(s) for s in every],
        [s["macro_f1"] for s in every],
        ".",
        color="lightgrey",
        label=f"every setting ({len(every)})",
    )
    front = sweep["frontier"]
    ax.errorbar(
        [_cost(s) for s in front],
        [s["macro_f1"] for s in front],
        yerr=_errors(front),
        fmt="o-",
        color="tab:blue",
        markersize=4,
        capsize=3,
        label="frontier (95% CI)",
    )
    marks = [("the file's own", sweep["own"], "s", "tab:orange")]
    if sweep.get("chosen") is not None:
        marks.append(("chosen", sweep["chosen"], "*", "tab:red"))
    for name, s, marker, colour in marks:
        ax.errorbar(
            [_cost(s)],
            [s["macro_f1"]],
            yerr=_errors([s]),
            fmt=marker,
            color=colour,
            markersize=12 if marker == "*" else 8,
            capsize=3,
            label=f"{name}: {s['setting']}",
        )
    target = sweep.get("target_macro_f1")
    if target is not None:
        ax.axhline(target, linestyle="--", color="grey", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("cost per 1,000 posts (USD)")
    ax.set_ylabel("macro-F1")
    ax.set_title(
        f"cascade thresholds on {sweep['gold']['rows']} gold rows\n{sweep['cascade']}",
        fontsize=10,
        parse_math=False,
    )
    ax.legend(loc="lower right", fontsize=7)
    return _save(fig, path)
