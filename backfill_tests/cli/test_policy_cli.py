"""``policy check`` and ``policy diff`` as an operator runs them (exit codes, lines, JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backfill_tests.cli_runs import cli_main
from backfill_tests.policy_helpers import COURSE_V4, COURSE_V5

BROKEN = """\
id: course
version: "1"
instructions: Moderate the forum.
labels:
  - id: ok
    description: Fine.
    action: none
  - id: ok
    description: Fine again.
    action: none
    colour: red
rules:
  - id: R 1
    label: cheating
    description: Cheats.
"""


def test_check_prints_identity_labels_rules_and_the_prefix_estimate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = cli_main(["policy", "check", str(COURSE_V5)], capsys)
    assert code == 0, out
    for needle in ("course-rubric", "course-rubric@5#", "solution_leak", "PAY-1", "tokens", "OK"):
        assert needle in out
    code, out, _ = cli_main(["policy", "check", "--json", str(COURSE_V5)], capsys)
    doc = json.loads(out)
    assert doc["ok"] and doc["id"] == "course-rubric" and doc["version"] == "5"
    assert [label["id"] for label in doc["labels"]][-1] == "ok"
    assert len(doc["rules"]) == 5 and doc["prefix_tokens_estimate"] > 500


def test_check_exits_2_listing_every_problem_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    code, out, err = cli_main(["policy", "check", str(path)], capsys)
    assert code == 2
    lines = out.strip().splitlines()
    assert [ln.split(":")[1] for ln in lines] == ["8", "10", "11", "13", "14"], out
    assert "duplicate label id 'ok'" in lines[0] and "second label with action none" in lines[1]
    assert "unknown field 'colour'" in lines[2] and "bad id 'R 1'" in lines[3]
    assert "unknown label 'cheating'" in lines[4]
    assert "5 problem(s)" in err
    code, out, _ = cli_main(["policy", "check", "--json", str(path)], capsys)
    doc = json.loads(out)
    assert code == 2 and not doc["ok"]
    assert (doc["problems"][0]["line"], doc["problems"][0]["column"]) == (8, 9)


def test_diff_lists_what_changed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli_main(["policy", "diff", "--json", str(COURSE_V4), str(COURSE_V5)], capsys)
    assert code == 0
    doc = json.loads(out)
    assert {(c["kind"], c["item"], c["change"]) for c in doc["changes"]} == {
        ("policy", "course-rubric", "changed"),
        ("rule", "SOL-1", "added"),
        ("rule", "PAY-1", "added"),
    }
    assert doc["same_keys"] is False
    code, out, _ = cli_main(["policy", "diff", str(COURSE_V5), str(COURSE_V5)], capsys)
    assert code == 0 and "0 change(s); same identity" in out


def test_a_bad_policy_path_in_the_environment_does_not_stop_policy_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BACKFILL_POLICY_PATH", "/no/such/policy.yaml")
    assert cli_main(["policy", "check", str(COURSE_V5)], capsys)[0] == 0
    code, _, err = cli_main(["dry-run"], capsys)
    assert code == 2 and "BACKFILL_POLICY_PATH" in err and "cannot read" in err
