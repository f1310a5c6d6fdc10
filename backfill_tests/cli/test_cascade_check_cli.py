"""``cascade check FILE`` as an operator runs it: exit 0 with the stages and the variables each
reads, exit 2 with every problem at its line, against the policy in force."""

from __future__ import annotations

import json
from pathlib import Path

from backfill_tests.cli_runs import cli_with_env
from backfill_tests.policy_helpers import COURSE_V5, DOCS_POLICIES

FORUM = str(DOCS_POLICIES / "forum-moderation.yaml")

GOOD = """\
stages:
  - name: screen
    dialect: openai-moderation
    model: omni-moderation-latest
    decide: {when: none_label, min_score: 0.97}   # decide "nothing applies" when confident
  - name: first-pass
    dialect: chat-json
    model: gpt-4o-mini
"""

BROKEN = """\
stages:
  - name: screen
    dialect: openai-moderation
    model: omni-moderation-latest
    api_key: sk-not-here
  - name: judge
    dialect: chat-json
    model: gpt-4o-mini
    decide: {when: any_label, min_score: 0.5}
"""


def _file(tmp_path: Path, text: str, name: str = "cascade.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_good_file_prints_its_stages_and_the_variables_each_reads(tmp_path: Path) -> None:
    path = _file(tmp_path, GOOD)
    code, out, err = cli_with_env(["cascade", "check", path], {"BACKFILL_POLICY_PATH": FORUM})
    assert code == 0, out + err
    for needle in (
        "screen",
        "openai-moderation",
        "omni-moderation-latest",
        "none_label >= 0.97",
        "everything left",
        "BACKFILL_MODEL_BASE_URL__SCREEN",
        "BACKFILL_MODEL_API_KEY__SCREEN",
        "BACKFILL_MODEL_BASE_URL__FIRST_PASS",
        "BACKFILL_MODEL_API_KEY__FIRST_PASS",
        "forum@1#",
        "OK",
    ):
        assert needle in out, (needle, out)


def test_json_has_the_stages_and_both_versions(tmp_path: Path) -> None:
    path = _file(tmp_path, GOOD)
    code, out, _ = cli_with_env(
        ["cascade", "check", "--json", path], {"BACKFILL_POLICY_PATH": FORUM}
    )
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"ok", "file", "stages", "routing_version", "stage_version"}
    assert doc["ok"] is True and doc["file"] == path
    assert doc["stages"] == [
        {
            "name": "screen",
            "dialect": "openai-moderation",
            "model": "omni-moderation-latest",
            "decide": {"when": "none_label", "min_score": 0.97},
            "base_url_var": "BACKFILL_MODEL_BASE_URL__SCREEN",
            "api_key_var": "BACKFILL_MODEL_API_KEY__SCREEN",
        },
        {
            "name": "first-pass",
            "dialect": "chat-json",
            "model": "gpt-4o-mini",
            "decide": None,
            "base_url_var": "BACKFILL_MODEL_BASE_URL__FIRST_PASS",
            "api_key_var": "BACKFILL_MODEL_API_KEY__FIRST_PASS",
        },
    ]
    assert len(doc["routing_version"]) == 16 and len(doc["stage_version"]) == 16
    # A threshold moves the routing version only.
    moved = _file(tmp_path, GOOD.replace("0.97", "0.9"), "moved.yaml")
    _, out, _ = cli_with_env(["cascade", "check", "--json", moved], {"BACKFILL_POLICY_PATH": FORUM})
    again = json.loads(out)
    assert again["routing_version"] != doc["routing_version"]
    assert again["stage_version"] == doc["stage_version"]


def test_problems_exit_2_each_at_its_line(tmp_path: Path) -> None:
    path = _file(tmp_path, BROKEN)
    code, out, err = cli_with_env(["cascade", "check", path], {"BACKFILL_POLICY_PATH": FORUM})
    assert code == 2
    lines = out.strip().splitlines()
    assert [ln.removeprefix(path + ":").split(":")[:2] for ln in lines] == [
        ["2", "5"],
        ["5", "5"],
        ["9", "5"],
    ], out
    assert "missing field 'decide'" in lines[0]
    assert "comes from the environment, BACKFILL_MODEL_API_KEY__SCREEN" in lines[1]
    assert "the last stage decides everything that reaches it" in lines[2]
    assert "sk-not-here" not in out + err
    assert "backfill-moderation cascade check: 3 problem(s)" in err
    code, out, _ = cli_with_env(
        ["cascade", "check", "--json", path], {"BACKFILL_POLICY_PATH": FORUM}
    )
    doc = json.loads(out)
    assert code == 2 and doc["ok"] is False and doc["file"] == path
    assert set(doc) == {"ok", "file", "problems"}
    assert doc["problems"][1] == {
        "file": path,
        "line": 5,
        "column": 5,
        "message": doc["problems"][1]["message"],
    }
    assert "BACKFILL_MODEL_API_KEY__SCREEN" in doc["problems"][1]["message"]


def test_a_dialect_the_policy_cannot_serve_is_a_problem_at_its_stage(tmp_path: Path) -> None:
    path = _file(tmp_path, GOOD)
    # The built-in policy, and the course rubric, have no dialects: openai-moderation: section.
    for env in ({}, {"BACKFILL_POLICY_PATH": str(COURSE_V5)}):
        code, out, _ = cli_with_env(["cascade", "check", path], env)
        assert code == 2, out
        (line,) = out.strip().splitlines()
        assert line.startswith(f"{path}:2:1: stage 'screen' (openai-moderation): "), line
        assert "dialects: openai-moderation: section" in line
    code, out, _ = cli_with_env(["cascade", "check", "--json", path], {})
    (problem,) = json.loads(out)["problems"]
    assert (problem["line"], problem["column"]) == (2, 1)


def test_a_missing_file_exits_2_saying_so(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.yaml")
    code, out, err = cli_with_env(["cascade", "check", path], {})
    assert code == 2
    assert out.strip() == f"{path}:1:1: cannot read: No such file or directory"
    assert "Traceback" not in err


def test_a_broken_policy_in_force_exits_2_naming_it(tmp_path: Path) -> None:
    path = _file(tmp_path, GOOD)
    code, out, err = cli_with_env(
        ["cascade", "check", path], {"BACKFILL_POLICY_PATH": str(tmp_path / "none.yaml")}
    )
    assert code == 2 and out == ""
    assert "backfill-moderation cascade check: error: BACKFILL_POLICY_PATH" in err
    assert "Traceback" not in err


def test_a_binary_file_is_one_problem(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\x00\xff" * 64)
    code, out, err = cli_with_env(["cascade", "check", str(path)], {})
    assert code == 2 and out.strip() == f"{path}:1:1: not valid UTF-8"
    assert "Traceback" not in err
