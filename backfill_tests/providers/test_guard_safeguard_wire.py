"""The wire of the guard dialects (pure): Llama Guard's two request shapes and where each API
puts the assessment's log-probability; where gpt-oss-safeguard's answer is taken from, with vLLM's
reasoning-parser faults, and never from reasoning prose."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from backfill_assets.domain.policy.dialects.llama_guard import GuardAnswer
from backfill_assets.domain.policy.file import parse_policy
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.providers.models.base import ModelRequest
from backfill_assets.providers.models.guard_wire import guard_answer, guard_body, post_in_prompt
from backfill_assets.providers.models.openai_wire import NotACompletion
from backfill_assets.providers.models.safeguard_wire import chosen_answer, last_json_object
from backfill_tests.domain.test_moderation_dialect import BASE

USAGE = {"prompt_tokens": 300, "completion_tokens": 4, "total_tokens": 304}


def _request(rubric: Rubric, text: str) -> ModelRequest:
    return ModelRequest(
        key="k",
        tenant_id="t",
        post_id="p",
        attempt=1,
        model="llama-guard-3-8b",
        messages=rubric.messages("k", text),
        max_output_tokens=rubric.max_output_tokens,
        estimated_tokens=1,
        contract=rubric.contract,
    )


def test_a_raw_prompt_goes_as_prompt_with_legacy_logprobs() -> None:
    rubric = Rubric(parse_policy(BASE), "llama-guard", "3")
    body = guard_body(_request(rubric, "hello there"), "max_completion_tokens", raw_prompt=True)
    assert set(body) == {"model", "prompt", "max_tokens", "temperature", "logprobs"}
    assert body["logprobs"] == 2 and body["temperature"] == 0
    assert post_in_prompt(body["prompt"]) == "hello there"


def test_the_chat_template_gets_the_post_with_chat_logprobs() -> None:
    section = "dialects:\n  llama-guard:\n    categories:\n      S1: T1\n"
    rubric = Rubric(parse_policy(BASE + section), "llama-guard", "3")
    body = guard_body(_request(rubric, "hello"), "max_completion_tokens", raw_prompt=False)
    assert body["messages"] == [{"role": "user", "content": "hello"}]
    assert body["logprobs"] is True and body["top_logprobs"] == 2
    assert body["max_completion_tokens"] == 64 and "response_format" not in body


def _stored(envelope_content: str) -> GuardAnswer:
    data = json.loads(envelope_content)
    return GuardAnswer(data["text"], data["logprob"])


def test_the_assessment_tokens_probability_in_both_apis() -> None:
    chat = {
        "id": "chatcmpl-1",
        "choices": [
            {
                "message": {"role": "assistant", "content": "\n\nunsafe\nS1"},
                "logprobs": {
                    "content": [
                        {"token": "\n\n", "logprob": -0.001, "top_logprobs": []},
                        {"token": "unsafe", "logprob": math.log(0.7), "top_logprobs": []},
                    ]
                },
            }
        ],
        "usage": USAGE,
    }
    env = guard_answer(json.dumps(chat).encode(), raw_prompt=False)
    assert _stored(env.content) == GuardAnswer("\n\nunsafe\nS1", pytest.approx(math.log(0.7)))
    assert env.billed is not None and env.billed.tokens_in == 300 and env.id == "chatcmpl-1"
    legacy = {
        "choices": [
            {
                "text": "safe",
                "logprobs": {"tokens": ["safe"], "token_logprobs": [-0.05], "top_logprobs": [{}]},
            }
        ],
        "usage": USAGE,
    }
    env = guard_answer(json.dumps(legacy).encode(), raw_prompt=True)
    assert _stored(env.content) == GuardAnswer("safe", -0.05)


@pytest.mark.parametrize(
    "logprobs",
    [
        None,
        {"content": None},
        {"content": [{"token": "safe", "logprob": 0.5}]},  # a positive log-probability
        {"content": [{"token": "safe", "logprob": "high"}]},
        {"content": [{"token": "safe", "logprob": True}]},
        {"content": [{"token": 7, "logprob": -0.1}]},
    ],
)
def test_no_readable_log_probability_gives_none(logprobs: Any) -> None:
    chat = {"choices": [{"message": {"content": "safe"}, "logprobs": logprobs}], "usage": USAGE}
    env = guard_answer(json.dumps(chat).encode(), raw_prompt=False)
    assert _stored(env.content) == GuardAnswer("safe", None)


def test_a_body_with_usage_but_no_answer_is_booked_then_refused() -> None:
    env = guard_answer(json.dumps({"choices": [], "usage": USAGE}).encode(), raw_prompt=True)
    assert env.billed is not None and _stored(env.content).text == ""
    with pytest.raises(NotACompletion):
        guard_answer(b'{"choices": []}', raw_prompt=True)


ANSWER = '{"schema_version":1,"correlation_id":"k","label":"ok","rule_ids":[],"confidence":0.9}'


@pytest.mark.parametrize(
    ("message", "answer", "where"),
    [
        ({"content": ANSWER, "reasoning_content": "The post is fine."}, ANSWER, "content"),
        ({"content": f"Here it is:\n```json\n{ANSWER}\n```"}, ANSWER, "content"),
        ({"content": None, "reasoning_content": ANSWER}, ANSWER, "reasoning_content"),
        ({"content": None, "reasoning": f"  {ANSWER}\n"}, ANSWER, "reasoning_content"),
        (
            {"content": None, "reasoning_content": 'Label "abuse"? {"x": 1} no. Final: ' + ANSWER},
            ANSWER,
            "reasoning_json",
        ),
        ({"content": "", "reasoning_content": "I think the label is abuse."}, "", "none"),
        ({"content": None}, "", "none"),
        ({"content": "The label is abuse."}, "The label is abuse.", "content"),
    ],
)
def test_the_answer_is_taken_from_the_final_channel_or_the_reasonings_json_never_its_prose(
    message: dict[str, Any], answer: str, where: str
) -> None:
    assert chosen_answer(message) == (answer, where)


def test_the_last_top_level_object_wins_and_nesting_is_kept() -> None:
    text = 'first {"a": 1} then {"b": {"c": 2}} trailing { broken'
    assert last_json_object(text) == '{"b": {"c": 2}}'
    assert last_json_object("no objects [1, 2]") is None
    assert last_json_object("{" * 50_000) is None  # hostile: bounded work, no answer
