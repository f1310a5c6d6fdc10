"""docs/configuration.md's tables, generated from the variables' declarations.

The page keeps its prose; each table sits between ``<!-- BEGIN variables SECTION -->`` and
``<!-- END variables -->`` and is rewritten from the settings groups (``GROUPS``) and
``ELSEWHERE``, so a new setting is documented where it is declared, and the page cannot drift
from the code:

    python -m backfill_assets.config.reference docs/configuration.md

rewrites the page in place; ``--check`` only says whether it is current (exit 1 if not).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from backfill_assets.config.variables import ELSEWHERE, GROUPS, SECTIONS, Documented
from backfill_assets.domain.ranges import bound_text

_BLOCK = re.compile(
    r"(<!-- BEGIN variables (?P<section>[a-z]+) -->\n).*?(<!-- END variables -->)", re.S
)
# The table of variables read by bin/* and the tests: it has a "used by" column.
PROCESSES = "processes"


def _shown(value: Any) -> str:
    """A default as the docs say it."""
    if value is None or value == "":
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    return f"`{value}`"


def _extra(info: FieldInfo) -> dict[str, Any]:
    """What ``variables._var`` put beside the field: how its default reads."""
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


def _default(info: FieldInfo) -> str:
    extra = _extra(info)
    if extra.get("shown"):
        return str(extra["shown"])
    return _shown(info.default)


def _name(name: str) -> str:
    return name if name.startswith("`") else f"`{name}`"


def rows(section: str) -> list[Documented]:
    """The variables documented in ``section``: declared fields first, in declaration order."""
    out: list[Documented] = []
    group = GROUPS.get(section)
    for info in group.model_fields.values() if group is not None else ():
        if isinstance(info.validation_alias, str):
            meaning = " ".join(filter(None, (info.description, range_text(info))))
            out.append(Documented(info.validation_alias, section, _default(info), meaning))
    return out + [d for d in ELSEWHERE if d.section == section]


def bounds(info: FieldInfo) -> dict[str, Any]:
    """A field's numeric bounds, by pydantic's names: ``ge``, ``gt``, ``le``, ``lt``."""
    return {
        name: getattr(m, name)
        for m in info.metadata
        for name in ("ge", "gt", "le", "lt")
        if getattr(m, name, None) is not None
    }


def range_text(info: FieldInfo) -> str:
    """A number's range as the docs say it (``Range: 1 to 1,024.``); ``""`` for the rest."""
    found = bounds(info)
    if not ({"ge", "gt"} & found.keys() and {"le", "lt"} & found.keys()):
        return ""
    end = f"up to {_number(found['le'])}" if "le" in found else f"below {_number(found['lt'])}"
    if "ge" in found:
        return f"Range: {_number(found['ge'])} {end.removeprefix('up ')}."
    return f"Range: above {_number(found['gt'])}, {end}."


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return bound_text(value) if isinstance(value, int) else str(value)


def table(section: str) -> str:
    """One section's markdown table."""
    if section == PROCESSES:
        lines = ["| variable | default | used by | meaning |", "|---|---|---|---|"]
        lines += [
            f"| {_name(d.name)} | {d.default} | {d.used_by} | {d.meaning} |" for d in rows(section)
        ]
    else:
        lines = ["| variable | default | meaning |", "|---|---|---|"]
        lines += [f"| {_name(d.name)} | {d.default} | {d.meaning} |" for d in rows(section)]
    return "\n".join(lines) + "\n"


def render(page: str) -> str:
    """``page`` with every marked table rewritten; an unknown section is an error."""

    def one(m: re.Match[str]) -> str:
        section = m["section"]
        if section not in SECTIONS and section != PROCESSES:
            raise ValueError(f"docs/configuration.md: no variables section {section!r}")
        return m.group(1) + table(section) + m.group(3)

    return _BLOCK.sub(one, page)


def sections_on(page: str) -> list[str]:
    """The sections ``page`` has a table for, in order."""
    return [m["section"] for m in _BLOCK.finditer(page)]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    if len(paths) != 1:
        sys.stderr.write(__doc__ or "")
        return 2
    path = Path(paths[0])
    page = path.read_text("utf-8")
    current = render(page)
    if check:
        if current != page:
            sys.stderr.write(f"{path} is out of date: run without --check to rewrite it\n")
            return 1
        return 0
    path.write_text(current, "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
