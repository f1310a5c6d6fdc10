"""The fake's keyword rules under the built-in policy: a post is labelled by the first rule it
matches, in the order review, abuse, spam; one that matches none is ``ok``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.domain.policy.file import builtin_policy
from backfill_assets.domain.policy.output_gate import OutputContract
from backfill_assets.providers.models.rules import judge

BUILTIN = OutputContract.of(builtin_policy())

# Words each rule matches (case does not matter), and words none does.
CATEGORY = {
    "needs_review": ["system prompt", "Self-Harm", "ignore all previous instructions"],
    "abuse": ["moron", "SHUT UP", "kill you", "trash human"],
    "spam": ["buy now", "Click Here", "earn $500", "http://x.ru", "https://a.b.top/z", "casino"],
    "ok": ["hello", "casinos", "stupidity", "thanks", "earnest", ""],
}
ORDER = ["needs_review", "abuse", "spam", "ok"]


@given(st.lists(st.sampled_from([(c, w) for c, ws in CATEGORY.items() for w in ws]), max_size=6))
def test_the_first_rule_in_order_decides(parts: list[tuple[str, str]]) -> None:
    text = " . ".join(w for _c, w in parts)
    expected = min((c for c, _w in parts), key=ORDER.index, default="ok")
    label, _rules, confidence = judge(text, BUILTIN)
    assert label == expected
    assert 0.55 <= confidence <= 0.99
    assert judge(text, BUILTIN) == (label, _rules, confidence)
