"""Policy files: every class of problem with its line, identity, the built-in policy's keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backfill_assets.domain.policy.diff import diff_policies, version_order
from backfill_assets.domain.policy.document import BUILTIN_CONTENT_HASH, LEGACY_KEY_VERSIONS
from backfill_assets.domain.policy.file import (
    PolicyInvalid,
    builtin_policy,
    builtin_policy_text,
    load_policy,
    parse_policy,
)
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import Versions, content_hash, work_key
from backfill_tests.policy_helpers import COURSE_V4, COURSE_V5

GOOD = """\
id: shop
version: "2"
instructions: Classify the post.
labels:
  - id: ok
    description: Nothing applies.
    action: none
  - id: scam
    description: A scam.
    action: hide
rules:
  - id: S-1
    label: scam
    description: Asks for money up front.
"""


def problems(text: str) -> list[tuple[int, int, str]]:
    with pytest.raises(PolicyInvalid) as exc:
        parse_policy(text, "p.yaml")
    return [(p.line, p.column, p.message) for p in exc.value.problems]


def one(text: str, words: str) -> tuple[int, int, str]:
    """The line, column and message of the one problem that says ``words``."""
    found = [p for p in problems(text) if words in p[2]]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        # A YAML syntax error: where the parser stopped.
        (GOOD.replace("  - id: scam", "  - id: [scam"), 9, 16, "YAML syntax"),
        # An unknown field, at its key.
        (
            GOOD.replace("    action: hide", "    action: hide\n    colour: red"),
            11,
            5,
            "unknown field",
        ),
        # A duplicate label id, at the second one's value.
        (GOOD.replace("id: scam", "id: ok"), 8, 9, "duplicate label id 'ok'"),
        # A duplicate rule id.
        (
            GOOD + "  - id: S-1\n    label: scam\n    description: again\n",
            15,
            9,
            "duplicate rule id 'S-1'",
        ),
        # A rule leading to an unknown label, at its label.
        (GOOD.replace("    label: scam", "    label: fraud"), 13, 12, "unknown label 'fraud'"),
        # A bad id (label, rule, policy).
        (GOOD.replace("id: scam", "id: 'a scam'"), 8, 9, "bad id"),
        (GOOD.replace("id: S-1", "id: S/1"), 12, 9, "bad id"),
        (GOOD.replace("id: shop", "id: Shop"), 1, 5, "bad id"),
        # No none label (at the first label), two of them (at the second's action).
        (GOOD.replace("action: none", "action: review"), 5, 3, "no label has action none"),
        (GOOD.replace("action: hide", "action: none"), 10, 13, "a second label with action none"),
        # An empty label set.
        (GOOD.split("labels:")[0] + "labels: []\n", 4, 9, "empty"),
        # A missing field, at its mapping; a wrong type.
        (GOOD.replace("    description: A scam.\n", ""), 8, 5, "missing field 'description'"),
        (
            GOOD.replace("action: hide", "action: delete"),
            10,
            13,
            "must be one of none, review, hide",
        ),
        (GOOD.replace('version: "2"', "version: 2.10"), 2, 10, "quote it"),
        # A duplicate key in a mapping (YAML itself would keep the last one silently).
        (GOOD.replace("id: shop", "id: shop\nid: other"), 2, 1, "duplicate key 'id'"),
    ],
)
def test_each_problem_is_reported_with_its_line_and_column(
    text: str, line: int, column: int, words: str
) -> None:
    got_line, got_column, message = one(text, words)
    assert (got_line, got_column) == (line, column), message


def test_every_problem_is_listed_at_once_in_line_order(tmp_path: Path) -> None:
    text = (
        GOOD.replace("id: shop", "id: Shop")
        .replace("action: hide", "action: none\n    colour: red")
        .replace("label: scam", "label: fraud")
    )
    found = problems(text)
    assert [(line, m.split(":")[0]) for line, _c, m in found] == [
        (1, "id"),
        (10, "labels[1]"),  # a second none label
        (11, "labels[1]"),  # unknown field 'colour'
        (14, "rules[0]"),  # unknown label 'fraud'
    ]
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PolicyInvalid) as exc:
        load_policy(path)
    listed = [ln for ln in str(exc.value).splitlines() if ln.startswith(f"{path}:")]
    assert len(listed) == len(found)


def test_a_valid_policy_has_its_parts() -> None:
    policy = parse_policy(GOOD)
    assert policy.label_ids == ("ok", "scam")
    assert policy.none_label == "ok" and policy.flagging_labels == ("scam",)
    assert policy.rule_labels == (("S-1", "scam"),)
    assert policy.identity == f"shop@2#{policy.content_hash[:16]}"
    assert policy.key_version == policy.identity


def test_comments_and_key_order_do_not_count_every_word_does() -> None:
    base = parse_policy(GOOD)
    reordered = GOOD.replace(
        "  - id: ok\n    description: Nothing applies.\n    action: none",
        "  # the label that means nothing applies\n  - action: none\n    description: Nothing"
        " applies.\n    id: ok",
    )
    assert parse_policy("# a comment\n" + reordered).identity == base.identity
    for old, new in [
        ("Classify the post.", "Classify the post!"),
        ("Asks for money up front.", "Asks for money upfront."),
        ("A scam.", "A scam"),
        ('version: "2"', 'version: "3"'),
    ]:
        assert parse_policy(GOOD.replace(old, new)).identity != base.identity, new
    examples = GOOD + "    examples:\n      violates: ['send $50 first']\n"
    assert parse_policy(examples).identity != base.identity
    assert parse_policy(examples.replace("$50", "$60")).identity != parse_policy(examples).identity


def test_versions_order_by_number_then_text() -> None:
    ordered = ["1", "2", "9", "10", "10.1", "v2", "v10"]
    assert sorted(reversed(ordered), key=version_order) == ordered


def test_the_builtin_policy_keeps_the_keys_of_the_prompt_it_replaced() -> None:
    # The built-in policy's content is pinned: an edit to it would re-key (and re-pay) every
    # archive labelled before policy files. Change it only with a new key version mapping.
    policy = builtin_policy()
    assert policy.content_hash == BUILTIN_CONTENT_HASH
    assert policy.key_version == LEGACY_KEY_VERSIONS[BUILTIN_CONTENT_HASH] == "policy@d0f22620582d"
    assert policy.label_ids == ("spam", "abuse", "needs_review", "ok")
    # The same content from a file (a copy) is the same policy; an edited copy is not.
    assert parse_policy(builtin_policy_text()).key_version == "policy@d0f22620582d"
    edited = (
        builtin_policy_text()
        .replace("Everything", "Anything")
        .replace("None of the above applies.", "Nothing above applies.")
    )
    assert parse_policy(edited).key_version.startswith("default@1#")


def test_golden_key_vector() -> None:
    # A refactor of keys, policies or versions must not re-key an archive: these keys were
    # computed by the code that filled today's stores.
    versions = Versions(TASK_VERSION, Rubric().key_version, "fake-moderator-1")
    assert versions.code_version == (
        "task=moderation-2026.1;prompt=policy@d0f22620582d;model=fake-moderator-1"
    )
    assert (
        work_key(versions, "acme", "p000001", content_hash("hello"))
        == "53249af288ce2a2f4ddceff3660f5c620a1bbb46db706a27e1449fccaa74ded4"
    )
    course = Rubric(load_policy(COURSE_V5))
    assert course.key_version == "course-rubric@5#7354a65d36893290"
    assert (
        work_key(
            Versions(TASK_VERSION, course.key_version, "gpt-4o-mini"),
            "learn",
            "post-1",
            content_hash("Café"),
        )
        == GOLDEN_COURSE_KEY
    )


GOLDEN_COURSE_KEY = "7d6fc5b6bb88049c6e55aba0e8b0e52cde3ef27b987ec2570df2026fd985553e"


def test_diff_lists_labels_and_rules_added_removed_changed() -> None:
    v4, v5 = load_policy(COURSE_V4), load_policy(COURSE_V5)
    found = {(c.kind, c.item, c.change) for c in diff_policies(v4, v5)}
    assert found == {
        ("policy", "course-rubric", "changed"),
        ("rule", "SOL-1", "added"),
        ("rule", "PAY-1", "added"),
    }
    back = {(c.kind, c.item, c.change) for c in diff_policies(v5, v4)}
    assert ("rule", "SOL-1", "removed") in back
    edited = parse_policy(COURSE_V5.read_text().replace("Advertising or links", "Adverts or links"))
    changes = diff_policies(v5, edited)
    assert [(c.kind, c.item, c.change, c.fields) for c in changes] == [
        ("label", "spam", "changed", ("description",))
    ]


def test_the_shipped_policy_files_are_valid_json_free_yaml() -> None:
    for path in (COURSE_V4, COURSE_V5):
        policy = load_policy(path)
        assert json.loads(json.dumps(policy.doc.model_dump(mode="json")))


def test_the_documented_example_is_the_shipped_file() -> None:
    # docs/policies.md shows the course rubric in full; it must be the file the tests use.
    docs = (COURSE_V5.parents[1] / "policies.md").read_text("utf-8")
    block = docs.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert block == COURSE_V5.read_text("utf-8")


@pytest.mark.parametrize(
    ("old", "new", "line", "column", "words"),
    [
        # Plain scalars YAML reads as numbers or dates it cannot hold: one problem, at them.
        ('version: "2"', "version: " + "9" * 5000, 2, 10, "is not a number YAML can read"),
        ('version: "2"', "version: 2020-13-45", 2, 10, "'2020-13-45' is not a date YAML can"),
        ('version: "2"', "version: 12:" + "9" * 5000, 2, 10, "version: "),
        (
            "    action: hide\n",
            "    action: hide\n    severity: " + "9" * 5000 + "\n",
            11,
            15,
            "labels[1].severity: '9999",
        ),
        # Numbers it can hold, out of their range.
        ('version: "2"', "version: " + "9" * 41, 2, 10, "bad version"),
        ("    action: hide\n", "    action: hide\n    severity: 1000001\n", 11, 15, "within"),
    ],
)
def test_a_number_out_of_range_is_one_problem_at_its_place(
    old: str, new: str, line: int, column: int, words: str
) -> None:
    found = problems(GOOD.replace(old, new))
    assert len(found) == 1, found
    assert found[0][:2] == (line, column) and words in found[0][2], found
    assert len(found[0][2]) < 300


def test_a_quoted_version_is_text_whatever_it_looks_like() -> None:
    assert parse_policy(GOOD.replace('version: "2"', 'version: "2020-13-45"')).version == (
        "2020-13-45"
    )


def test_a_control_character_yaml_refuses_is_a_problem_at_its_place() -> None:
    assert one(GOOD.replace('version: "2"', 'version: "2\x1f"'), "U+001F") == (
        2,
        12,
        "character U+001F is not allowed in YAML",
    )
