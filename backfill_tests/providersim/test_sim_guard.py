"""Llama Guard 3/4 behind vLLM over real HTTP: both request shapes, logprobs, pins, switches,
faults, the meter and the shared rate limits."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shlex
import time
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providersim import SimConfig, add_cli_arguments, config_from_args
from backfill_assets.providersim.guard_models.llama_guard import template_tokens

GUARD3 = "meta-llama/Llama-Guard-3-8B"
GUARD4 = "llama-guard-4-12b"
VIOLENT = "I will kill them all tomorrow"
HARMLESS = "The weather is lovely and the tea is warm."
VIOLENT_HATE = "I hate them and I will kill them"
SCAM = "Send me 1 BTC and get 2 back, this is no scam"
CUSTOM = (
    ("Spam", "Unsolicited advertising.\nLinks to shops, giveaways."),
    ("Harassment", "Insults and threats aimed at a person."),
    ("Scams", "Schemes to take people's money."),
)
TASK = (
    "Task: Check if there is unsafe content in 'User' messages in conversations according our "
    "safety policy with the below categories."
)
ASK = (
    "Provide your safety assessment for ONLY THE LAST User message in the above conversation:\n"
    " - First line must read 'safe' or 'unsafe'.\n"
    " - If unsafe, a second line must include a comma-separated list of violated categories."
)


def _key(text: str) -> str:
    """A post's correlation id and pin key: its sha256 hex."""
    return hashlib.sha256(text.encode()).hexdigest()


def render(post: str, categories: tuple[tuple[str, str], ...] = CUSTOM, v4: bool = False) -> str:
    """A Llama Guard prompt in Meta's format (Llama Guard 4: its own special tokens)."""
    start, end, eot = (
        ("<|header_start|>", "<|header_end|>", "<|eot|>")
        if v4
        else ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
    )
    lines = "\n".join(f"S{n}: {name}.\n{doc}" for n, (name, doc) in enumerate(categories, 1))
    return (
        f"<|begin_of_text|>{start}user{end}\n\n{TASK}\n\n"
        f"<BEGIN UNSAFE CONTENT CATEGORIES>\n{lines}\n<END UNSAFE CONTENT CATEGORIES>\n\n"
        f"<BEGIN CONVERSATION>\n\nUser: {post}\n\n<END CONVERSATION>\n\n"
        f"{ASK}{eot}{start}assistant{end}\n\n"
    )


def _chat(client: httpx.Client, post: str, model: str = GUARD3, **extra: Any) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": post}],
        "max_tokens": 20,
        "temperature": 0,
        **extra,
    }
    return client.post("/chat/completions", json=body)


def _complete(
    client: httpx.Client, prompt: str, model: str = GUARD3, **extra: Any
) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": 20, "temperature": 0, **extra}
    return client.post("/completions", json=body)


def _chat_text(client: httpx.Client, post: str, **extra: Any) -> str:
    resp = _chat(client, post, **extra)
    assert resp.status_code == 200, resp.text
    content: str = resp.json()["choices"][0]["message"]["content"]
    return content


def _completion_text(client: httpx.Client, post: str, **extra: Any) -> str:
    resp = _complete(client, render(post), **extra)
    assert resp.status_code == 200, resp.text
    text: str = resp.json()["choices"][0]["text"]
    return text


# --- The chat route: built-in categories ---------------------------------------------------


def test_chat_route_answers_with_the_built_in_categories(start_sim) -> None:
    expected = {
        HARMLESS: "safe",
        VIOLENT: "unsafe\nS1",
        VIOLENT_HATE: "unsafe\nS1,S10",
        SCAM: "unsafe\nS2",
        "sometimes I want to kill myself": "unsafe\nS11",  # the longer phrase wins
        "skills and stability": "safe",  # whole words only
    }
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        got = {post: _chat_text(client, post) for post in expected}
        # The model is recognised by name in any case, Llama Guard 4 as well.
        other = _chat_text(client, VIOLENT_HATE, model="LLAMA-GUARD-4-12B")
    assert got == expected
    assert other == "unsafe\nS1,S10"


def test_chat_answer_has_vllms_shape_and_usage(start_sim) -> None:
    sim = start_sim()
    body = {
        "model": GUARD3,
        "messages": [{"role": "user", "content": VIOLENT_HATE}],
        "max_completion_tokens": 20,
        "temperature": 0,
    }
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/chat/completions", json=body)
    data = resp.json()
    assert resp.status_code == 200
    assert data["object"] == "chat.completion"
    assert data["model"] == GUARD3
    [choice] = data["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"] is None  # not asked for
    # The post and its message, and the task and categories the chat template wraps it in.
    prompt = count_tokens(VIOLENT_HATE) + 4 + template_tokens()
    # unsafe, \n, S1, ",", S10
    assert data["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 5,
        "total_tokens": prompt + 5,
    }


def test_chat_logprobs_one_entry_per_token_with_both_assessments_first(start_sim) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        first = _chat(client, VIOLENT_HATE, logprobs=True, top_logprobs=2).json()
        again = _chat(client, VIOLENT_HATE, logprobs=True, top_logprobs=2).json()
        one = _chat(client, HARMLESS, logprobs=True, top_logprobs=1).json()
        none = _chat(client, HARMLESS, logprobs=True).json()
        off = _chat(client, HARMLESS, logprobs=False).json()

    entries = first["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in entries] == ["unsafe", "\n", "S1", ",", "S10"]
    for entry in entries:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["logprob"] <= 0.0
        assert len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy: the argmax
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]
        for alt in entry["top_logprobs"]:
            assert set(alt) == {"token", "logprob", "bytes"}
            assert alt["bytes"] == list(alt["token"].encode())
    assessment = entries[0]
    assert {alt["token"] for alt in assessment["top_logprobs"]} == {"safe", "unsafe"}
    assert math.log(0.55) <= assessment["logprob"] <= math.log(0.999)
    assert sum(math.exp(alt["logprob"]) for alt in assessment["top_logprobs"]) <= 1.0
    assert all(e["logprob"] >= math.log(0.98) for e in entries[1:])
    # Deterministic from the text.
    assert again["choices"][0]["logprobs"] == first["choices"][0]["logprobs"]

    [safe] = one["choices"][0]["logprobs"]["content"]
    assert safe["token"] == "safe"
    assert [alt["token"] for alt in safe["top_logprobs"]] == ["safe"]
    assert none["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    assert off["choices"][0]["logprobs"] is None


def test_top_logprobs_without_logprobs_is_refused(start_sim) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = _chat(client, HARMLESS, top_logprobs=2)
        bad = _chat(client, HARMLESS, logprobs=True, top_logprobs=21)
    assert resp.status_code == bad.status_code == 400
    assert resp.json()["error"]["param"] == "top_logprobs"
    assert bad.json()["error"]["param"] == "top_logprobs"


def test_max_tokens_cut_the_answer_with_finish_reason_length(start_sim) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        chat = _chat(client, VIOLENT_HATE, max_tokens=1, logprobs=True).json()
        legacy = _complete(client, render(SCAM), max_tokens=2).json()
    assert chat["choices"][0]["message"]["content"] == "unsafe"
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens"] == 1
    assert len(chat["choices"][0]["logprobs"]["content"]) == 1
    assert legacy["choices"][0]["text"] == "unsafe\n"
    assert legacy["choices"][0]["finish_reason"] == "length"


# --- The completions route: custom categories ----------------------------------------------


def test_completions_route_judges_under_the_prompts_categories(start_sim) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        scam = _completion_text(client, SCAM)  # "scam" names S3 (Scams), plural ignored
        harassed = _completion_text(client, "stop the HARASSMENT of my sister")
        harmless = _completion_text(client, HARMLESS)
        # Built-in phrases mean nothing here: only the prompt's categories count.
        violent = _completion_text(client, VIOLENT)
        both = _completion_text(client, "spam and scams everywhere")  # the first category
    assert (scam, harassed, harmless, violent) == ("unsafe\nS3", "unsafe\nS2", "safe", "safe")
    assert both == "unsafe\nS1"


def test_completion_answer_has_the_legacy_shape(start_sim) -> None:
    sim = start_sim()
    prompt = render(SCAM)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = _complete(client, prompt, model="llama-guard-3-8b", logprobs=2)
        plain = _complete(client, prompt).json()
        zero = _complete(client, prompt, logprobs=0).json()
    data = resp.json()
    assert resp.status_code == 200
    assert resp.headers["x-request-id"].startswith("req_")
    assert data["id"].startswith("cmpl-")
    assert (data["object"], data["model"]) == ("text_completion", "llama-guard-3-8b")
    assert isinstance(data["created"], int)
    [choice] = data["choices"]
    assert (choice["index"], choice["text"], choice["finish_reason"]) == (0, "unsafe\nS3", "stop")
    logprobs = choice["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert logprobs["tokens"] == ["unsafe", "\n", "S3"]
    assert logprobs["text_offset"] == [0, 6, 7]
    assert len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == 3
    assessment = logprobs["top_logprobs"][0]
    assert set(assessment) == {"unsafe", "safe"}
    assert assessment["unsafe"] == logprobs["token_logprobs"][0] > assessment["safe"]
    assert math.exp(assessment["unsafe"]) + math.exp(assessment["safe"]) <= 1.0
    for token, top in zip(logprobs["tokens"], logprobs["top_logprobs"], strict=True):
        assert len(top) == 2 and max(top, key=top.__getitem__) == token
    assert data["usage"] == {
        "prompt_tokens": count_tokens(prompt),
        "completion_tokens": 3,
        "total_tokens": count_tokens(prompt) + 3,
    }
    assert plain["choices"][0]["logprobs"] is None
    assert [list(top) for top in zero["choices"][0]["logprobs"]["top_logprobs"]] == [
        ["unsafe"],
        ["\n"],
        ["S3"],
    ]


def test_llama_guard_4_prompts_are_read_alike(start_sim) -> None:
    sim = start_sim()
    post = "so many scams\n\nand spam too"  # a blank line inside the post
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        three = _complete(client, render(post), logprobs=2).json()
        four = _complete(client, render(post, v4=True), model=GUARD4, logprobs=2).json()
    assert three["choices"][0]["text"] == four["choices"][0]["text"] == "unsafe\nS1"
    assert three["choices"][0]["logprobs"] == four["choices"][0]["logprobs"]
    calls = sim.meter.snapshot().billed.values()
    assert {c.correlation_id for c in calls} == {_key(post)}


@pytest.mark.parametrize(
    "prompt",
    [
        "Is this post safe? I will kill you",
        render(HARMLESS).replace("<BEGIN UNSAFE CONTENT CATEGORIES>", ""),
        render(HARMLESS).replace("<END CONVERSATION>", ""),
        render(HARMLESS, categories=()),
        render(HARMLESS).replace("User: ", "Agent: "),
    ],
)
def test_a_prompt_without_the_markers_is_refused(start_sim, prompt) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = _complete(client, prompt)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "prompt")
    snap = sim.meter.snapshot()
    assert (snap.billed, snap.timestamps) == ({}, ())


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{", None),
        (b'{"prompt": "x"}', "model"),
        (b'{"model": "llama-guard-3-8b"}', "prompt"),
        (b'{"model": "llama-guard-3-8b", "prompt": ["a", "b"]}', "prompt"),
        (b'{"model": "llama-guard-3-8b", "prompt": "x", "logprobs": true}', "logprobs"),
        (b'{"model": "llama-guard-3-8b", "prompt": "x", "logprobs": 21}', "logprobs"),
        (b'{"model": "llama-guard-3-8b", "prompt": "x", "max_tokens": 0}', "max_tokens"),
        (b'{"model": "llama-guard-3-8b", "prompt": "x", "temperature": 3}', "temperature"),
    ],
)
def test_bad_completion_bodies_answer_400(start_sim, body, param) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/completions", content=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == param


def test_echo_errors_quote_the_prompts_post(start_sim) -> None:
    sim = start_sim(echo_errors=True)
    secret = "call me at +1 555 0100"
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = _complete(client, render(secret), logprobs=99)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].endswith(f"Invalid content: '{secret}'")


# --- Pins and switches ---------------------------------------------------------------------


def test_pinned_answers_are_sent_verbatim_on_both_routes(start_sim) -> None:
    pins = {_key(HARMLESS): "unsafe\nS4", _key(VIOLENT): "I think this is fine??"}
    sim = start_sim(guard_answers=pins, guard_whitespace=True, guard_case=True)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        chat = [_chat_text(client, post) for post in (HARMLESS, VIOLENT)]
        legacy = [_completion_text(client, post) for post in (HARMLESS, VIOLENT)]
        unpinned = _chat_text(client, SCAM)
    assert chat == legacy == ["unsafe\nS4", "I think this is fine??"]
    assert unpinned.strip().lower() == "unsafe\ns2"  # the switches dress the others


def test_pins_keyed_by_anything_but_a_sha256_are_refused() -> None:
    with pytest.raises(ValidationError, match="sha256 hex"):
        SimConfig(guard_answers={"I will kill you": "unsafe\nS1"})


def test_whitespace_switch_wraps_the_answer(start_sim) -> None:
    sim = start_sim(guard_whitespace=True)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        unsafe = _chat(client, VIOLENT, logprobs=True, top_logprobs=2).json()
        safe = _completion_text(client, HARMLESS)
    assert unsafe["choices"][0]["message"]["content"] == "\n\n unsafe\nS1 \n"
    assert safe == "\n\n safe \n"
    entries = unsafe["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in entries] == ["\n", "\n", " ", "unsafe", "\n", "S1", " ", "\n"]
    assert unsafe["usage"]["completion_tokens"] == 8
    # The assessment's token carries the assessment's probability, wherever it stands.
    assert {alt["token"] for alt in entries[3]["top_logprobs"]} == {"safe", "unsafe"}


def test_case_switch_capitalises_or_upper_cases_the_assessment(start_sim) -> None:
    sim = start_sim(guard_case=True)
    posts = [f"post number {i}" for i in range(12)] + [f"kill number {i}" for i in range(12)]
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        answers = [_chat_text(client, post) for post in posts]
        logprobs = _chat(client, VIOLENT, logprobs=True, top_logprobs=2).json()
    assessments = {answer.split("\n")[0] for answer in answers}
    assert assessments == {"Safe", "SAFE", "Unsafe", "UNSAFE"}
    assert all(a.split("\n")[1:] in ([], ["S1"]) for a in answers)
    assessment = logprobs["choices"][0]["logprobs"]["content"][0]
    assert {alt["token"].lower() for alt in assessment["top_logprobs"]} == {"safe", "unsafe"}
    assert assessment["top_logprobs"][1]["token"] in {"Safe", "SAFE"}


def test_third_line_switch_adds_the_categories_names_to_unsafe_answers(start_sim) -> None:
    sim = start_sim(guard_third_line=True)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        builtin = _chat_text(client, VIOLENT_HATE)
        custom = _completion_text(client, SCAM)
        safe = _chat_text(client, HARMLESS)
    assert builtin == "unsafe\nS1,S10\nViolent Crimes, Hate"
    assert custom == "unsafe\nS3\nScams"
    assert safe == "safe"


def test_unknown_code_switch_lists_a_code_the_categories_lack(start_sim) -> None:
    sim = start_sim(guard_unknown_code=True)
    many = (*((f"Topic {n}", "x") for n in range(1, 100)), ("Scams", "x"))
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        builtin = _chat_text(client, VIOLENT)
        custom = _complete(client, render(SCAM, categories=many)).json()["choices"][0]["text"]
        safe = _chat_text(client, HARMLESS)
    assert builtin == "unsafe\nS1,S99"
    assert custom == "unsafe\nS100,S101"  # S99 is one of this prompt's
    assert safe == "safe"


def test_cli_flags_set_the_guard_switches() -> None:
    parser = argparse.ArgumentParser(prog="provider-sim")
    add_cli_arguments(parser)
    ns = parser.parse_args(
        shlex.split("--guard-whitespace --guard-case --guard-third-line --guard-unknown-code")
    )
    config = config_from_args(ns)
    assert (
        config.guard_whitespace,
        config.guard_case,
        config.guard_third_line,
        config.guard_unknown_code,
    ) == (True, True, True, True)
    assert config_from_args(parser.parse_args([])) == SimConfig()


# --- Faults --------------------------------------------------------------------------------


def test_content_faults_distort_the_answer(start_sim) -> None:
    faults = {
        _key(VIOLENT): "malformed",
        _key(HARMLESS): "unknown_label",
        _key(SCAM): "wrong_key",
        _key(VIOLENT_HATE): "bad_confidence",
    }
    sim = start_sim(fault_by_key=faults)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        malformed = _chat_text(client, VIOLENT)
        unknown = _completion_text(client, HARMLESS)
        wrong_chat = _chat(client, SCAM).json()
        wrong_legacy = _complete(client, render(SCAM), logprobs=2).json()
        bad = _chat(client, VIOLENT_HATE, logprobs=True, top_logprobs=2).json()
        bad_legacy = _complete(client, render(VIOLENT_HATE), logprobs=2).json()

    first_line = malformed.split("\n")[0].strip().lower()
    assert first_line not in {"safe", "unsafe"}
    assert unknown == "unsafe\nS99"
    assert wrong_chat["choices"] == wrong_legacy["choices"] == []
    assert wrong_chat["usage"]["completion_tokens"] == 3  # billed all the same
    assessment = bad["choices"][0]["logprobs"]["content"][0]
    assert assessment["token"] == "unsafe"
    assert assessment["logprob"] == pytest.approx(math.log(1.7), abs=1e-6)
    assert bad_legacy["choices"][0]["logprobs"]["token_logprobs"][0] > 0.0
    assert len(sim.meter.snapshot().billed) == 6


@pytest.mark.parametrize(("kind", "status"), [("500", 500), ("503", 503), ("429", 429)])
def test_status_faults_bill_nothing_on_either_route(start_sim, kind, status) -> None:
    sim = start_sim(fault_by_key={_key(VIOLENT): kind})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        chat = _chat(client, VIOLENT)
        legacy = _complete(client, render(VIOLENT))
        healthy = _chat(client, HARMLESS)
    assert chat.status_code == legacy.status_code == status
    assert healthy.status_code == 200
    snap = sim.meter.snapshot()
    assert [c.correlation_id for c in snap.billed.values()] == [_key(HARMLESS)]
    assert snap.calls_by_correlation_id[_key(VIOLENT)] == 2


# --- Meter, prices and limits --------------------------------------------------------------


def test_meter_bills_both_routes_at_the_guard_models_prices(start_sim) -> None:
    sim = start_sim()
    prompt = render(SCAM)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        chat = _chat(client, VIOLENT_HATE, model="llama-guard-3-8b")
        legacy = _complete(client, prompt, model="llama-guard-3-8b")
        start = int(time.time()) - 86_400
        usage = client.get(f"/organization/usage/completions?start_time={start}").json()
    snap = sim.meter.snapshot()
    chat_call = snap.billed[chat.headers["x-request-id"]]
    legacy_call = snap.billed[legacy.headers["x-request-id"]]
    assert chat_call.endpoint == "/v1/chat/completions"
    assert legacy_call.endpoint == "/v1/completions"
    assert (legacy_call.prompt_tokens, legacy_call.completion_tokens) == (count_tokens(prompt), 3)
    assert legacy_call.correlation_id == _key(SCAM)
    assert chat_call.correlation_id == _key(VIOLENT_HATE)
    for call in (chat_call, legacy_call):
        # $0.20 per million tokens in and out: 200 nano-dollars a token.
        assert call.cost_nanos == 200 * call.total_tokens
    by_endpoint = snap.billed_by_endpoint
    assert by_endpoint["/v1/completions"].calls == 1
    assert by_endpoint["/v1/completions"].cost_nanos == legacy_call.cost_nanos
    assert snap.requests_by_endpoint == {"/v1/chat/completions": 1, "/v1/completions": 1}
    served = httpx.get(sim.base_url.removesuffix("/v1") + "/_sim/meter").json()
    assert served["billed_by_endpoint"]["/v1/completions"] == {
        "calls": 1,
        "cost_nanos": legacy_call.cost_nanos,
    }
    assert [item.get("endpoint") for item in served["billed"]] == [None, "/v1/completions"]
    # Legacy completions are completions to the organisation's usage API.
    [result] = [r for bucket in usage["data"] for r in bucket["results"]]
    assert (result["model"], result["num_model_requests"]) == ("llama-guard-3-8b", 2)


def test_guard_models_are_listed_priced_and_pass_strict_models(start_sim) -> None:
    sim = start_sim(strict_models=True)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        listed = {m["id"] for m in client.get("/models").json()["data"]}
        statuses = [
            _chat(client, HARMLESS, model="llama-guard-3-8b").status_code,
            _complete(client, render(HARMLESS), model="llama-guard-4-12b").status_code,
            _complete(client, render(HARMLESS), model="llama-guard-9").status_code,
        ]
    assert {"llama-guard-3-8b", "llama-guard-4-12b", GUARD3} <= listed
    assert statuses == [200, 200, 404]
    prices = SimConfig().prices
    assert prices["llama-guard-3-8b"] == ("0.20", "0.20", "0.20")
    assert prices["gpt-oss-safeguard-20b"] == ("0.075", "0.075", "0.30")
    assert prices["gpt-oss-safeguard-120b"] == ("0.18", "0.18", "0.60")


def test_both_routes_share_the_chat_rate_limit_buckets(start_sim) -> None:
    sim = start_sim(rpm=60)  # one request a second, bucket of one
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        first = _complete(client, render(HARMLESS))
        limited = [
            _chat(client, HARMLESS),
            _complete(client, render(HARMLESS)),
            client.post("/chat/completions", json=chat),
        ]
    assert first.status_code == 200
    assert [r.status_code for r in limited] == [429, 429, 429]
    assert limited[1].json()["error"]["code"] == "rate_limit_exceeded"


def test_tpm_charges_the_prompt_and_max_tokens(start_sim) -> None:
    prompt = render("word " * 100)
    charge = count_tokens(prompt) + 20
    sim = start_sim(tpm=charge * 60)  # a bucket of exactly one such request
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        answers = [_complete(client, prompt) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 429]
    assert f"Requested {charge}." in answers[1].json()["error"]["message"]


def test_logprobs_are_floats_in_the_json(start_sim) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        raw = _complete(client, render(HARMLESS), logprobs=1).content
    logprobs = json.loads(raw)["choices"][0]["logprobs"]
    assert all(isinstance(lp, float) for lp in logprobs["token_logprobs"])
