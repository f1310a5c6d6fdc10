"""The Dagster release the accelerators were written against, and the fall-back on any other.

Every accelerator subclasses Dagster's storage through private names (``dagster_private.py``)
that may change in any release. So each class a ``dagster.yaml`` names (``instance_class.py``,
``sqlite_instance.py``, ``pg_instance.py``) asks ``accelerated`` first: on the release below it
builds the accelerated storage, on any other Dagster's own, and the process logs one warning.
The product does not care which it gets (``defs/instance_api.py``).
"""

from __future__ import annotations

import importlib.metadata
import logging

import dagster as dg

# The releases ``dagster_private.py``'s names were read from (a matched set: constraints.txt).
WRITTEN_FOR = "1.13.27"
WRITTEN_FOR_POSTGRES = "0.29.27"

_LOG = logging.getLogger(__name__)
_warned = False


def accelerated(postgres: bool = False) -> bool:
    """Whether the installed Dagster (and, with ``postgres``, dagster-postgres) is the release
    the accelerators were written against; if not, one warning a process."""
    found = [("dagster", dg.__version__, WRITTEN_FOR)]
    if postgres:
        have = importlib.metadata.version("dagster-postgres")
        found.append(("dagster-postgres", have, WRITTEN_FOR_POSTGRES))
    wrong = [f"{name} {have} (written for {want})" for name, have, want in found if have != want]
    if wrong:
        _warn_once(", ".join(wrong))
    return not wrong


def _warn_once(what: str) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    _LOG.warning(
        "backfill_assets.accelerators: %s; using Dagster's own storage (slower, same data). "
        "Remove the accelerators from dagster.yaml (instance_class, storage: custom) to "
        "silence this.",
        what,
    )
