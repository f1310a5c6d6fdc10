"""The run config a launch can send: every leaf field of every job the code location exposes,
enumerated from the definitions, so a field added later is covered by the tests that use it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import dagster as dg
from pydantic import BaseModel

from backfill_assets.config.settings import Settings
from backfill_assets.definitions import build_definitions


def config_leaves(
    config_type: Any, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every leaf field of a run config schema: its path and its kind (``SCALAR``,
    ``SCALAR_UNION`` for a source such as ``StringSource``, ``ANY``, ``ENUM``)."""
    kind = config_type.kind.value
    if kind in ("STRICT_SHAPE", "PERMISSIVE_SHAPE", "SELECTOR"):
        for name, field in config_type.fields.items():
            yield from config_leaves(field.config_type, (*path, name))
    elif kind in ("NONEABLE", "ARRAY", "MAP"):
        yield from config_leaves(config_type.inner_type, path)
    else:
        yield path, kind


def nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """``{"a": {"b": value}}`` for the path ``("a", "b")``."""
    doc: Any = value
    for name in reversed(path):
        doc = {name: doc}
    out: dict[str, Any] = doc
    return out


def job_config_leaves(settings: Settings) -> list[tuple[dg.JobDefinition, tuple[str, ...], str]]:
    """(job, field path, kind) for every leaf of every job's run config schema."""
    defs = build_definitions(settings)
    return [
        (job, path, kind)
        for job in defs.resolve_all_job_defs()
        for path, kind in config_leaves(job.run_config_schema.config_type)
    ]


def resource_fields(resource: object) -> dict[str, Any]:
    """Every field a resource holds, by name: a settings group's own, or those of the groups
    (and plain values) a resource holds; what a launch that tried to set one would name."""
    if isinstance(resource, BaseModel):
        return resource.model_dump()
    found: dict[str, Any] = {}
    for f in dataclasses.fields(resource):  # type: ignore[arg-type]
        value = getattr(resource, f.name)
        found.update(resource_fields(value) if isinstance(value, BaseModel) else {f.name: value})
    return found
