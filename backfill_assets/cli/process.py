"""How the ``backfill-moderation`` process treats its heap and how it ends.

Everything a command imports (Dagster, SQLAlchemy, pandas and pandera: hundreds of thousands
of objects) lives until the process ends, yet Python's garbage collector walks all of it on
every full collection, and a run allocates enough per key to trigger many. ``freeze_heap``
moves what exists into the collector's permanent generation (``gc.freeze``), so full
collections skip it (measured in docs/benchmarks.md). It is called once start-up's imports are
done, again by each command that loads the runner (``run``, ``import``, ``evaluate``,
``verify``: Dagster, pandas and pandera load only then), and by ``run`` just before it forks its
helpers, which then share those pages with their parent instead of copying them as the
collector touches them. Cyclic garbage that exists at
a freeze is never collected; at those points there is little.

At exit CPython clears every module and runs a full garbage collection over everything
Dagster, pandas and pandera loaded, which can take as long as a no-op rerun's whole work.
Nothing of ours needs it: every result, ledger row and Dagster event
is committed before the command returns (a SIGKILL at that point loses nothing either), so the
process flushes its output, runs the ``atexit`` hooks (logging's flush among them), closes the
store's connections and leaves with ``os._exit``. If a thread other than the main one is still
alive, the process exits the ordinary way, which waits for it.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
import threading
from typing import NoReturn


def freeze_heap() -> None:
    """Exempt every object that exists now from garbage collection (see the module's text)."""
    gc.freeze()


def exit_process(code: int) -> NoReturn:
    """End the process with ``code`` once its output is flushed and its hooks have run."""
    # ``_run_exitfuncs`` is CPython's own (typeshed lists it); without it, the ordinary exit.
    run_hooks = getattr(atexit, "_run_exitfuncs", None)
    if threading.active_count() > 1 or run_hooks is None:
        sys.exit(code)
    run_hooks()
    # Only a command that opened the store loaded the engines' module; none other has any to
    # close, and importing it here would only slow the exit.
    engines = sys.modules.get("backfill_assets.ledger.engines")
    if engines is not None:
        engines.dispose_engines()  # SQLite checkpoints its WAL as the last connection closes
    for stream in (sys.stdout, sys.stderr):
        # A closed pipe: nothing more can be said on it.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
