"""The example policies of docs/policies.md, and texts the fake model labels under them."""

from __future__ import annotations

from pathlib import Path

from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.policy.file import load_policy
from backfill_assets.domain.policy.rubric import TASK_VERSION, Rubric
from backfill_assets.domain.work.keys import Versions

DOCS_POLICIES = Path(__file__).resolve().parents[1] / "docs" / "policies"
COURSE_V4 = DOCS_POLICIES / "course-rubric-v4.yaml"
COURSE_V5 = DOCS_POLICIES / "course-rubric-v5.yaml"
FAKE_MODEL = "fake-moderator-1"

# What the fake model answers under the course rubric (rule or label ids in the text decide,
# then the keyword rules for labels the policy shares with the built-in one, then "ok").
COURSE_TEXTS = {
    "SOL-1": "Full solution for assignment 3 below, copy it (SOL-1)",
    "SOL-2": "Answer key from last year, see SOL-2",
    "PAY-1": "I do your project for $40 PAY-1",
    "HAR-1": "You are an idiot",  # keyword rule: abuse is not a label here, so -> ok
    "SPAM-1": "BUY NOW limited offer http://cheap-watch.xyz",  # keyword: spam -> SPAM-1
    "review": "Is sharing half of my code needs_review material?",
    "ok": "Week 3 lecture notes are up, thanks!",
}


def course(version: str = "5") -> Policy:
    """The course rubric, v4 or v5."""
    return load_policy(COURSE_V5 if version == "5" else COURSE_V4)


def edited(policy_file: Path, out: Path, old: str, new: str) -> Path:
    """A copy of a policy file with one text replaced (a rule edited)."""
    text = policy_file.read_text("utf-8")
    assert old in text, old
    out.write_text(text.replace(old, new), encoding="utf-8")
    return out


def versions_of(rubric: Rubric, model: str = FAKE_MODEL) -> Versions:
    """The versions that name ``rubric``'s work with ``model``."""
    return Versions(TASK_VERSION, rubric.key_version, model)
