"""``ledger/tables.py`` mirrors what ``sql/`` creates, table by table, on both stores: the same
tables, the same columns, nullability and type family. A migration and its mirror cannot
drift apart unnoticed."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.ledger.tables import metadata

# Tables of the store that have no mirror on purpose.
UNMIRRORED = {"schema_migrations"}
_FAMILIES = (
    ("bool", (sa.Boolean,)),
    ("int", (sa.Integer,)),  # BigInteger and SmallInteger are Integers
    ("number", (sa.Float, sa.Numeric)),
    ("time", (sa.DateTime, sa.Date)),
    ("text", (sa.String, sa.Text)),
    ("bytes", (sa.LargeBinary,)),
)


def family(kind: sa.types.TypeEngine[object]) -> str:
    for name, types in _FAMILIES:
        if isinstance(kind, types):
            return name
    return type(kind).__name__


def test_every_table_and_column_matches_its_migration(engine: Engine) -> None:
    inspector = sa.inspect(engine)
    in_store = set(inspector.get_table_names()) - UNMIRRORED
    assert in_store == set(metadata.tables), "tables created by sql/ vs mirrored in tables.py"
    problems = []
    for table in metadata.sorted_tables:
        found = {c["name"]: c for c in inspector.get_columns(table.name)}
        if set(found) != {c.name for c in table.c}:
            problems.append(f"{table.name}: columns {sorted(found)} vs {sorted(table.c.keys())}")
            continue
        for col in table.c:
            got = found[col.name]
            # SQLite lets a non-INTEGER primary key hold NULL unless declared NOT NULL (a
            # documented quirk), and reflects those keys as nullable; the writers never send one.
            lenient = col.primary_key and engine.dialect.name == "sqlite"
            if bool(got["nullable"]) != bool(col.nullable) and not lenient:
                problems.append(f"{table.name}.{col.name}: nullable {got['nullable']}")
            if family(got["type"]) != family(col.type):
                problems.append(
                    f"{table.name}.{col.name}: {got['type']} in the store, {col.type} mirrored"
                )
    assert problems == [], "\n".join(problems)
