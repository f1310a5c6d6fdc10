"""Which column of an export holds which field of a post: ``--map`` (pure).

Every format is read as rows of named values (a JSON object, a CSV header, a Parquet schema, a
query's result columns); a ``ColumnMap`` picks the post's fields out of them. Without a map a
field is read under its own name or its camelCase alias (``tenantId``, ``postId``), as JSONL
exports have always been; ``--map post_id=id`` reads it from ``id`` instead, and only there.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

FIELDS = ("tenant_id", "post_id", "text", "region")
REQUIRED = ("tenant_id", "post_id", "text")
_ALIASES: Mapping[str, tuple[str, ...]] = {
    "tenant_id": ("tenant_id", "tenantId"),
    "post_id": ("post_id", "postId"),
    "text": ("text",),
    "region": ("region",),
}
_MAX_COLUMN_CHARS = 128


class ColumnMapError(ValueError):
    """A ``--map`` that names an unknown field, a field twice or an empty column."""


def _shown(name: str) -> str:
    return "".join(c for c in name[:40] if c.isprintable())


def parse_field_map(spec: str | None, fields: Collection[str]) -> dict[str, str]:
    """``--map FIELD=COLUMN,...`` of any import (posts, decisions, baselines): field ->
    column, each field among ``fields`` once, each column short, printable and taken once.
    Raises ``ColumnMapError`` naming what is wrong (blank: no mapping)."""
    mapped: dict[str, str] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        name, sep, column = part.partition("=")
        name, column = name.strip(), column.strip()
        if not sep or not column:
            raise ColumnMapError(f"{_shown(part)!r}: expected FIELD=COLUMN")
        if name not in fields:
            raise ColumnMapError(f"unknown field {_shown(name)!r}; fields: {', '.join(fields)}")
        if name in mapped:
            raise ColumnMapError(f"field {name} is mapped twice")
        if len(column) > _MAX_COLUMN_CHARS or not column.isprintable():
            raise ColumnMapError(f"column name for {name} is not a printable short name")
        mapped[name] = column
    taken = list(mapped.values())
    if len(set(taken)) != len(taken):
        raise ColumnMapError("two fields are mapped to the same column")
    return mapped


@dataclass(frozen=True)
class ColumnMap:
    """Field -> the source column that holds it (fields not named use their default names)."""

    mapped: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str | None) -> ColumnMap:
        """``tenant_id=workspace,post_id=id,text=body`` (blank: no mapping)."""
        return cls(parse_field_map(spec, FIELDS))

    def names(self, name: str) -> tuple[str, ...]:
        """The columns a row may give ``name`` under."""
        if name in self.mapped:
            return (self.mapped[name],)
        return _ALIASES[name]

    def pick(self, row: Mapping[str, Any], name: str) -> tuple[bool, Any]:
        """(present, value) of a field; two aliases holding different values are an error."""
        found = [(col, row[col]) for col in self.names(name) if col in row]
        if len(found) > 1 and found[0][1] != found[1][1]:
            raise ValueError(f"conflicting {found[0][0]} and {found[1][0]}")
        return (True, found[0][1]) if found else (False, None)

    def missing(self, columns: Collection[str], bound_tenant: bool) -> list[str]:
        """Required fields no column of a header or schema holds (``bound_tenant``: an import
        bound to one tenant needs no tenant column)."""
        wanted = [n for n in REQUIRED if not (bound_tenant and n == "tenant_id")]
        return [n for n in wanted if not any(c in columns for c in self.names(n))]

    def describe_missing(self, columns: Collection[str], bound_tenant: bool) -> str | None:
        """Why a header or schema cannot be imported, or ``None`` if it can."""
        gone = self.missing(columns, bound_tenant)
        if not gone:
            return None
        needs = "; ".join(f"{n} (from {' or '.join(self.names(n))})" for n in gone)
        shown = ", ".join(_shown(c) for c in list(columns)[:20]) or "none"
        return (
            f"no column for {needs}; its columns: {shown} "
            "(--map FIELD=COLUMN reads a field from another column)"
        )

    def source_columns(self, columns: Collection[str]) -> list[str]:
        """The columns of ``columns`` that any field reads (what a reader needs to load)."""
        wanted = {c for n in FIELDS for c in self.names(n)}
        return [c for c in columns if c in wanted]


DEFAULT_COLUMNS = ColumnMap()
