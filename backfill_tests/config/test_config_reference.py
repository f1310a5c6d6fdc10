"""docs/configuration.md is generated from the variables' declarations: every variable has a
section and a meaning, the page is current, and a resource's field is described once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from backfill_assets.config import reference as ref
from backfill_assets.config.variables import (
    ELSEWHERE,
    GROUPS,
    SECTIONS,
    ChecksSettings,
    RunSettings,
)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_every_variable_is_declared_with_a_section_and_a_meaning() -> None:
    assert list(GROUPS) == list(SECTIONS)
    named = [f for g in GROUPS.values() for f in g.model_fields.values()]
    assert len(named) > 60
    for info in named:
        assert isinstance(info.validation_alias, str), info
        assert info.description and info.description.endswith((".", ")")), info.validation_alias
    sections = set(SECTIONS) | {ref.PROCESSES}
    assert {d.section for d in ELSEWHERE} <= sections


def test_the_page_is_what_the_declarations_generate() -> None:
    page = PAGE.read_text("utf-8")
    assert ref.render(page) == page, (
        "docs/configuration.md is out of date: run "
        "python -m backfill_assets.config.reference docs/configuration.md"
    )
    assert sorted(ref.sections_on(page)) == sorted([*SECTIONS, ref.PROCESSES])


def test_a_group_field_is_described_once_and_its_default_shown() -> None:
    run = {d.name: d for d in ref.rows("run")}
    described = RunSettings.model_fields["concurrency"].description
    # The range follows the description, from the same declaration.
    assert run["BACKFILL_CONCURRENCY"].meaning == f"{described} Range: 1 to 1,024."
    assert run["BACKFILL_CONCURRENCY"].default == str(RunSettings().concurrency)
    checks = {d.name: d for d in ref.rows("checks")}
    assert checks["BACKFILL_CHECK_MAX_REBILLED_SHARE"].default == "0.05"
    assert checks["BACKFILL_APPLY_LIVE"].default == "off"
    assert checks["BACKFILL_DRIFT_BASELINE"].meaning == (
        ChecksSettings.model_fields["drift_baseline"].description
    )


def test_a_stale_table_is_rewritten_and_the_command_says_so(tmp_path: Path) -> None:
    page = tmp_path / "configuration.md"
    page.write_text(
        "# x\n\n<!-- BEGIN variables orchestration -->\n| stale |\n<!-- END variables -->\n"
        "\nprose stays\n"
    )
    cmd = [sys.executable, "-m", "backfill_assets.config.reference"]
    check = subprocess.run([*cmd, "--check", str(page)], capture_output=True, text=True)
    assert check.returncode == 1 and "out of date" in check.stderr
    assert subprocess.run([*cmd, str(page)]).returncode == 0
    text = page.read_text()
    assert "| stale |" not in text and "`BACKFILL_PARTITIONS_PER_RUN` | 16 |" in text
    assert text.endswith("<!-- END variables -->\n\nprose stays\n")
    assert subprocess.run([*cmd, "--check", str(page)]).returncode == 0


def test_an_unknown_section_is_refused() -> None:
    with pytest.raises(ValueError, match="no variables section 'nope'"):
        ref.render("<!-- BEGIN variables nope -->\n<!-- END variables -->\n")
