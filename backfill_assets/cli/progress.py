"""Live progress for long commands (``import`` here; reusable by ``run``), drawn with rich.

Drawn on stderr, and only when both stdout and stderr are terminals and the output is not
JSON: piped, redirected or ``--json`` output never carries progress lines.
"""

from __future__ import annotations

import sys
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from backfill_assets.cli.tables import terminal_text

Counter = int | float | str


def wanted(json_output: bool = False) -> bool:
    """Whether live progress should be drawn: on a terminal, and not for ``--json``."""
    return not json_output and sys.stdout.isatty() and sys.stderr.isatty()


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.4g}"


class _Count(ProgressColumn):
    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        total = "?" if task.total is None else _number(task.total)
        return Text(f"{_number(task.completed)}/{total} {self.unit}")


class _Rate(ProgressColumn):
    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if speed is None and task.elapsed:
            speed = task.completed / task.elapsed  # fewer samples than rich's estimate needs
        return Text("" if speed is None else f"{_number(round(speed))} {self.unit}/s")


class _Counters(ProgressColumn):
    def render(self, task: Task) -> Text:
        counters: dict[str, Counter] = task.fields.get("counters", {})
        return Text(
            terminal_text(
                "  ".join(
                    f"{k} {_number(v) if isinstance(v, int | float) else v}"
                    for k, v in counters.items()
                ),
                lines=False,
            )
        )


class ProgressDisplay:
    """One live row per task: done/total, rate, ETA and free counters; a no-op when disabled.

    ``update("acme", done=1200, total=5000, tokens=81000, cost="$0.02", retries=3)``: the
    first call for a task adds its row, later calls move it. ``total=None`` means unknown
    (no ETA).
    """

    def __init__(self, unit: str, enabled: bool, console: Console | None = None) -> None:
        self.unit = unit
        self.enabled = enabled
        self._console = console
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}

    def _start(self) -> Progress:
        if self._progress is None:
            self._progress = Progress(
                # A task is named by outside text (a file name): shown as text, not markup.
                TextColumn("{task.description}", style="bold", markup=False),
                BarColumn(),
                _Count(self.unit),
                _Rate(self.unit),
                TimeRemainingColumn(),
                _Counters(),
                console=self._console or Console(stderr=True),
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._progress.start()
        return self._progress

    def update(
        self, task: str, done: float, total: float | None = None, **counters: Counter
    ) -> None:
        """Set a task's progress (added on first use); does nothing when disabled."""
        if not self.enabled:
            return
        progress = self._start()
        if task not in self._tasks:
            name = terminal_text(task, lines=False)
            self._tasks[task] = progress.add_task(name, total=total, counters=counters)
        progress.update(self._tasks[task], completed=done, total=total, counters=counters)

    def close(self) -> None:
        """Draw the last state and stop refreshing."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> ProgressDisplay:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
