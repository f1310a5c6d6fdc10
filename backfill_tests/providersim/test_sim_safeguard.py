"""gpt-oss-safeguard behind vLLM over real HTTP: content and analysis apart, reasoning tokens
by effort, the length cut, each switch and content fault, and the meter."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from typing import Any

import httpx
import pytest

from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providersim import SimConfig, add_cli_arguments, config_from_args

MODEL = "gpt-oss-safeguard-20b"
ABUSIVE = "you are such an idiot"
HARMLESS = "The weather is lovely and the tea is warm."
LABELS = ("ok", "spam", "abuse", "needs_review")
EFFORT_RANGES = {"low": (60, 150), "medium": (200, 500), "high": (600, 1500)}


def _body(key: str, text: str, **extra: Any) -> dict[str, Any]:
    """What the product sends: the policy as system message, the framed post, the schema."""
    rubric = Rubric()
    return {
        "model": MODEL,
        "messages": rubric.messages(key, text),
        "reasoning_effort": "low",
        "max_tokens": 2000,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "moderation", "strict": True, "schema": rubric.schema},
        },
        **extra,
    }


def _post(sim, body: dict[str, Any]) -> dict[str, Any]:
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def _message(data: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = data["choices"][0]["message"]
    return message


def _no_json_object(text: str) -> bool:
    return "{" not in text and "}" not in text


def test_content_is_the_chat_json_answer_and_the_analysis_stands_apart(start_sim, key_for) -> None:
    key = key_for("abusive")
    sim = start_sim()
    data = _post(sim, _body(key, ABUSIVE))
    message = _message(data)
    assert set(message) == {"role", "content", "refusal", "reasoning_content"}
    answer = json.loads(message["content"])
    assert set(answer) == {"schema_version", "correlation_id", "label", "rule_ids", "confidence"}
    assert (answer["correlation_id"], answer["label"]) == (key, "abuse")
    assert data["choices"][0]["finish_reason"] == "stop"
    reasoning = message["reasoning_content"]
    assert _no_json_object(reasoning)
    # Prose that names labels, the chosen one last: no parser may take it for the answer.
    assert reasoning.endswith("So the label is abuse.")
    assert {"ok", "spam"} & set(re.findall(r"[a-z_]+", reasoning))
    usage = data["usage"]
    reasoning_tokens = usage["completion_tokens_details"]["reasoning_tokens"]
    assert reasoning_tokens == count_tokens(reasoning)
    assert usage["completion_tokens"] == reasoning_tokens + count_tokens(message["content"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_the_model_is_recognised_by_name_in_any_case(start_sim, key_for) -> None:
    sim = start_sim()
    body = _body(key_for("x"), HARMLESS, model="openai/GPT-OSS-SafeGuard-120b")
    plain = _body(key_for("x"), HARMLESS, model="gpt-4o-mini")
    assert "reasoning_content" in _message(_post(sim, body))
    assert "reasoning_content" not in _message(_post(sim, plain))


@pytest.mark.parametrize("effort", ["low", "medium", "high", None])
def test_reasoning_tokens_grow_with_effort_and_are_billed(start_sim, key_for, effort) -> None:
    sim = start_sim()
    posts = [f"{HARMLESS} number {i}" for i in range(6)]
    seen = []
    for i, post in enumerate(posts):
        body = _body(key_for(f"p{i}"), post, max_tokens=4000)
        if effort is None:
            del body["reasoning_effort"]
        else:
            body["reasoning_effort"] = effort
        data = _post(sim, body)
        seen.append(data["usage"]["completion_tokens_details"]["reasoning_tokens"])
    low, high = EFFORT_RANGES[effort or "medium"]  # gpt-oss reasons at medium unless told
    assert all(low <= r <= high for r in seen), seen
    assert len(set(seen)) > 1  # drawn per text
    snap = sim.meter.snapshot()
    billed = [call.completion_tokens for call in snap.billed.values()]
    # The bill holds the reasoning: every call's completion tokens exceed its reasoning.
    assert all(b > r for b, r in zip(billed, seen, strict=True))
    # $0.075 in and $0.30 out per million tokens.
    for call in snap.billed.values():
        assert call.cost_nanos == round(75 * call.prompt_tokens + 300 * call.completion_tokens)


def test_same_post_same_reasoning(start_sim, key_for) -> None:
    sim = start_sim()
    first = _post(sim, _body(key_for("a"), ABUSIVE))
    again = _post(sim, _body(key_for("a"), ABUSIVE))
    assert _message(first) == _message(again)
    assert first["usage"] == again["usage"]


def test_reasoning_field_switch_names_the_field_reasoning(start_sim, key_for) -> None:
    sim = start_sim(safeguard_reasoning_field="reasoning")
    message = _message(_post(sim, _body(key_for("a"), ABUSIVE)))
    assert "reasoning_content" not in message
    assert message["reasoning"].endswith("So the label is abuse.")


def test_output_over_max_tokens_is_cut_with_content_null(start_sim, key_for) -> None:
    sim = start_sim()
    full = _post(sim, _body(key_for("a"), ABUSIVE))
    reasoning = full["usage"]["completion_tokens_details"]["reasoning_tokens"]
    total = full["usage"]["completion_tokens"]
    in_reasoning = _post(sim, _body(key_for("a"), ABUSIVE, max_tokens=reasoning - 10))
    in_final = _post(sim, _body(key_for("a"), ABUSIVE, max_completion_tokens=total - 1))

    for data, cap in ((in_reasoning, reasoning - 10), (in_final, total - 1)):
        assert data["choices"][0]["finish_reason"] == "length"
        assert _message(data)["content"] is None
        assert data["usage"]["completion_tokens"] == cap
    assert in_reasoning["usage"]["completion_tokens_details"]["reasoning_tokens"] == reasoning - 10
    assert count_tokens(_message(in_reasoning)["reasoning_content"]) == reasoning - 10
    assert in_final["usage"]["completion_tokens_details"]["reasoning_tokens"] == reasoning
    billed = [c.completion_tokens for c in sim.meter.snapshot().billed.values()]
    assert billed == [total, reasoning - 10, total - 1]


def test_content_null_switch_puts_the_answer_in_the_reasoning(start_sim, key_for) -> None:
    key = key_for("a")
    sim = start_sim(safeguard_content_null=True)
    data = _post(sim, _body(key, ABUSIVE))
    message = _message(data)
    assert message["content"] is None
    assert json.loads(message["reasoning_content"])["correlation_id"] == key
    tokens = count_tokens(message["reasoning_content"])
    assert data["usage"]["completion_tokens"] == tokens
    assert data["usage"]["completion_tokens_details"]["reasoning_tokens"] == tokens


def test_answer_in_reasoning_switch_ends_the_prose_with_the_json(start_sim, key_for) -> None:
    key = key_for("a")
    sim = start_sim(safeguard_answer_in_reasoning=True)
    message = _message(_post(sim, _body(key, ABUSIVE)))
    assert message["content"] is None
    prose, _, final = message["reasoning_content"].rpartition("\n\n")
    assert prose.endswith("So the label is abuse.")
    assert json.loads(final)["label"] == "abuse"


def test_prose_only_switch_names_a_label_without_json(start_sim, key_for) -> None:
    sim = start_sim(safeguard_prose_only=True)
    data = _post(sim, _body(key_for("a"), ABUSIVE))
    message = _message(data)
    assert message["content"] is None
    assert _no_json_object(message["reasoning_content"])
    assert "abuse" in message["reasoning_content"]
    assert data["choices"][0]["finish_reason"] == "stop"


def test_unenforced_switch_wraps_the_json_in_a_fence_or_prose(start_sim, key_for) -> None:
    sim = start_sim(safeguard_unenforced=True)
    contents = [
        _message(_post(sim, _body(key_for(f"k{i}"), f"{ABUSIVE} {i}")))["content"]
        for i in range(10)
    ]
    fenced = [c for c in contents if c.startswith("```json\n")]
    prose = [c for c in contents if not c.startswith("```")]
    assert fenced and prose
    for content in contents:
        with pytest.raises(json.JSONDecodeError):
            json.loads(content)
        inner = content[content.index("{") : content.rindex("}") + 1]
        assert json.loads(inner)["label"] == "abuse"


def test_no_reasoning_usage_switch_drops_the_details(start_sim, key_for) -> None:
    sim = start_sim(safeguard_no_reasoning_usage=True)
    data = _post(sim, _body(key_for("a"), ABUSIVE))
    usage = data["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    reasoning = count_tokens(_message(data)["reasoning_content"])
    assert usage["completion_tokens"] > reasoning  # still billed in full


@pytest.mark.parametrize(
    ("shape", "details"),
    [("full", "reasoning_tokens"), ("details_null", None), ("total_only", "absent")],
)
def test_usage_shapes_keep_the_true_reasoning_tokens(start_sim, key_for, shape, details) -> None:
    sim = start_sim(usage_shape=shape)
    data = _post(sim, _body(key_for("a"), ABUSIVE))
    reasoning = count_tokens(_message(data)["reasoning_content"])
    usage = data["usage"]
    if details == "reasoning_tokens":
        assert usage["completion_tokens_details"]["reasoning_tokens"] == reasoning
        assert usage["completion_tokens_details"]["audio_tokens"] == 0
    elif details is None:
        assert usage["completion_tokens_details"] is None
    else:
        assert set(usage) == {"total_tokens"}


def test_content_faults_distort_the_final_answer(start_sim, key_for) -> None:
    keys = {kind: key_for(kind) for kind in ("malformed", "wrong_key", "unknown_label")}
    keys["bad_confidence"] = key_for("bad_confidence")
    sim = start_sim(fault_by_key={key: kind for kind, key in keys.items()})
    got = {kind: _post(sim, _body(key, ABUSIVE)) for kind, key in keys.items()}

    malformed = _message(got["malformed"])["content"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(malformed)
    assert got["malformed"]["choices"][0]["finish_reason"] == "length"
    assert json.loads(_message(got["wrong_key"])["content"])["correlation_id"] != keys["wrong_key"]
    assert json.loads(_message(got["unknown_label"])["content"])["label"] not in LABELS
    assert json.loads(_message(got["bad_confidence"])["content"])["confidence"] > 1.0
    for data in got.values():
        assert _message(data)["reasoning_content"].endswith("So the label is abuse.")


def test_status_faults_bill_nothing(start_sim, key_for) -> None:
    key = key_for("a")
    sim = start_sim(fault_by_key={key: "503"})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/chat/completions", json=_body(key, ABUSIVE))
    assert resp.status_code == 503
    assert sim.meter.snapshot().billed == {}


def test_an_unknown_reasoning_effort_is_refused(start_sim, key_for) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post(
            "/chat/completions", json=_body(key_for("a"), ABUSIVE, reasoning_effort="max")
        )
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "reasoning_effort"


def test_cli_flags_set_the_safeguard_switches() -> None:
    parser = argparse.ArgumentParser(prog="provider-sim")
    add_cli_arguments(parser)
    ns = parser.parse_args(
        shlex.split(
            "--safeguard-reasoning-field reasoning --safeguard-content-null "
            "--safeguard-answer-in-reasoning --safeguard-prose-only --safeguard-unenforced "
            "--safeguard-no-reasoning-usage"
        )
    )
    assert config_from_args(ns) == SimConfig(
        safeguard_reasoning_field="reasoning",
        safeguard_content_null=True,
        safeguard_answer_in_reasoning=True,
        safeguard_prose_only=True,
        safeguard_unenforced=True,
        safeguard_no_reasoning_usage=True,
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--safeguard-reasoning-field", "thoughts"])
