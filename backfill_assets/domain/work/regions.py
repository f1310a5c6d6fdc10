"""Region names, the environment variables that configure them, and region run tags (pure).

A tenant's region decides which endpoint its requests go to (data residency). Region names are
checked here, once; whether a region has an endpoint is configuration of the process that
dispatches, so it is checked there (``routing.py``), not when the region is set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

REGION_PATTERN = "^[a-z][a-z0-9-]{1,19}$"
_REGION_RE = re.compile(r"[a-z][a-z0-9-]{1,19}")
BASE_URL_VAR = "BACKFILL_MODEL_BASE_URL"
API_KEY_VAR = "BACKFILL_MODEL_API_KEY"
# The tag the run queue can limit on (``tag_concurrency_limits`` in dagster.yaml).
REGION_TAG = "region"


class InvalidRegion(ValueError):
    """A region name that does not match ``REGION_PATTERN``."""


def validate_region(value: object) -> str:
    """``value`` if it is a well-formed region name; else ``InvalidRegion`` saying why."""
    if not isinstance(value, str):
        raise InvalidRegion(f"region must be a string, got {type(value).__name__}")
    if not _REGION_RE.fullmatch(value):
        shown = "".join(c for c in value[:40] if c.isprintable())
        raise InvalidRegion(f"region {shown!r} does not match {REGION_PATTERN}")
    return value


def env_suffix(region: str) -> str:
    """The variable suffix of a region: upper case, ``-`` as ``_`` (``us-east`` -> ``US_EAST``).

    Region names have no ``_``, so two regions never share a suffix.
    """
    return validate_region(region).upper().replace("-", "_")


def base_url_var(region: str) -> str:
    """``BACKFILL_MODEL_BASE_URL__<REGION>``."""
    return f"{BASE_URL_VAR}__{env_suffix(region)}"


def api_key_var(region: str) -> str:
    """``BACKFILL_MODEL_API_KEY__<REGION>``: read by name at run time, never put in config."""
    return f"{API_KEY_VAR}__{env_suffix(region)}"


def region_of_suffix(suffix: str) -> str:
    """The region a variable suffix names (``US_EAST`` -> ``us-east``); ``InvalidRegion`` if
    the suffix is not the upper-case form of a well-formed region name."""
    region = suffix.lower().replace("_", "-")
    if suffix != suffix.upper() or env_suffix(validate_region(region)) != suffix:
        raise InvalidRegion(
            f"suffix {suffix!r} is not an upper-case region name (e.g. EU, US_EAST)"
        )
    return region


def run_tags(regions: Iterable[str | None]) -> dict[str, str]:
    """The ``region`` tag of a run over tenants in ``regions`` (their regions, one per tenant).

    Tenants without a region get no tag (the default endpoint is limited by the other queue
    limits only). A run is meant to cover one region; one that mixes several is tagged with
    all of them joined by ``+`` (``default`` standing for tenants without a region), which
    the queue treats as a lane of its own.
    """
    distinct = set(regions)
    if not distinct or distinct == {None}:
        return {}
    if len(distinct) == 1:
        only = next(iter(distinct))
        assert only is not None
        return {REGION_TAG: only}
    return {REGION_TAG: "+".join(sorted(r or "default" for r in distinct))}


def unavailable_message(partitions_by_region: Mapping[str, Sequence[str]]) -> str:
    """Why partitions were not dispatched: their region has no endpoint in this process."""
    parts = []
    for region in sorted(partitions_by_region):
        keys = sorted(partitions_by_region[region])
        tenants = sorted({k.split("|", 1)[-1] for k in keys})
        shown = ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
        parts.append(
            f"no endpoint for region {region!r} in this process (set {base_url_var(region)}); "
            f"nothing was sent for tenant(s) {', '.join(tenants)}, so partition(s) {shown} failed"
        )
    return "; ".join(parts)
