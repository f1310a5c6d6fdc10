"""401, 403 and 404 in OpenAI's wire format on every route, and the meter's refusal counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from backfill_assets.providersim import Simulator
from backfill_tests.providersim.batchkit import FAST, jsonl, request_lines, submit, upload, wait

RIGHT_KEY = "sk-proj-right0key0000000000000000000000"
WRONG_KEY = "sk-proj-Wr0ngKey9f8e7d6c5b4a3210zzQ7x"
OPENAI_ERROR_FIELDS = {"message", "type", "param", "code"}


def _every_route(
    client: httpx.Client, chat_body: Callable[..., dict[str, Any]], key: str, ids: dict[str, str]
) -> dict[str, httpx.Response]:
    """One request per /v1 route; ``ids`` names an existing file and batch."""
    content = jsonl(request_lines(chat_body, [key]))
    batch_body = {
        "input_file_id": ids["file"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    return {
        "POST /v1/chat/completions": client.post("/chat/completions", json=chat_body(key)),
        "GET /v1/models": client.get("/models"),
        "POST /v1/files": upload(client, content),
        "GET /v1/files/{file_id}": client.get(f"/files/{ids['file']}"),
        "GET /v1/files/{file_id}/content": client.get(f"/files/{ids['file']}/content"),
        "POST /v1/batches": client.post("/batches", json=batch_body),
        "GET /v1/batches": client.get("/batches"),
        "GET /v1/batches/{batch_id}": client.get(f"/batches/{ids['batch']}"),
        "POST /v1/batches/{batch_id}/cancel": client.post(f"/batches/{ids['batch']}/cancel"),
    }


def _existing(sim: Simulator, chat_body, key: str, token: str | None = None) -> dict[str, str]:
    """A file and a batch created with a good key (or none), to probe the other routes with."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=sim.base_url, timeout=5, headers=headers) as client:
        batch = submit(client, request_lines(chat_body, [key]))
    return {"file": batch["input_file_id"], "batch": batch["id"]}


def test_wrong_key_gets_openais_401_with_the_key_masked_on_every_route(
    start_sim, chat_body, key_for
) -> None:
    sim = start_sim(api_key=RIGHT_KEY, **FAST)
    key = key_for("auth")
    ids = _existing(sim, chat_body, key, RIGHT_KEY)
    sim.reset()
    headers = {"authorization": f"Bearer {WRONG_KEY}"}
    with httpx.Client(base_url=sim.base_url, timeout=5, headers=headers) as client:
        answers = _every_route(client, chat_body, key, ids)

    masked = "sk-proj-" + "*" * (len(WRONG_KEY) - 12) + "zQ7x"
    for route, resp in answers.items():
        assert resp.status_code == 401, route
        assert resp.json() == {
            "error": {
                "message": f"Incorrect API key provided: {masked}. You can find your API key "
                "at https://platform.openai.com/account/api-keys.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        }, route
        assert WRONG_KEY not in resp.text and RIGHT_KEY not in resp.text
    meter = sim.meter.snapshot()
    assert meter.refusals_by_status == {401: len(answers)}
    assert meter.refusals_by_endpoint == dict.fromkeys(answers, 1)
    assert (meter.files_uploaded, meter.batch_creates_total, meter.billed) == (0, 0, {})
    assert meter.batch_create_requests == 1


def test_short_keys_are_echoed_whole_like_openai_does(start_sim, chat_body, key_for) -> None:
    sim = start_sim(api_key=RIGHT_KEY)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        short = client.post(
            "/chat/completions",
            json=chat_body(key_for("s")),
            headers={"authorization": "Bearer sk-short"},
        )
        missing = client.post("/chat/completions", json=chat_body(key_for("s")))
    assert short.json()["error"]["message"].startswith("Incorrect API key provided: sk-short. ")
    assert missing.json()["error"]["message"].startswith("You didn't provide an API key.")
    assert missing.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        (
            "region",
            {
                "message": "Country, region, or territory not supported",
                "type": "request_forbidden",
                "param": None,
                "code": "unsupported_country_region_territory",
            },
        ),
        (
            "permission",
            {
                "message": "You have insufficient permissions for this operation. Check that "
                "your key is allowed to use this endpoint and model.",
                "type": "permission_error",
                "param": None,
                "code": "insufficient_permissions",
            },
        ),
    ],
)
def test_forbid_answers_403_on_every_route(start_sim, chat_body, key_for, mode, error) -> None:
    sim = start_sim(forbid=mode)
    ids = {"file": "file-abc", "batch": "batch_abc"}
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        answers = _every_route(client, chat_body, key_for("f"), ids)
    for route, resp in answers.items():
        assert (resp.status_code, resp.json()) == (403, {"error": error}), route
    meter = sim.meter.snapshot()
    assert meter.refusals_by_status == {403: len(answers)}
    assert meter.billed == {} and meter.calls_by_correlation_id == {}


def test_a_wrong_key_is_refused_before_forbid(start_sim, chat_body, key_for) -> None:
    sim = start_sim(api_key=RIGHT_KEY, forbid="region")
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        wrong = client.post("/chat/completions", json=chat_body(key_for("o")))
        right = client.post(
            "/chat/completions",
            json=chat_body(key_for("o")),
            headers={"authorization": f"Bearer {RIGHT_KEY}"},
        )
    assert (wrong.status_code, right.status_code) == (401, 403)


def test_strict_models_answer_404_for_chat_and_batch_create(
    start_sim: Callable[..., Simulator], chat_body, key_for
) -> None:
    sim = start_sim(models=("gpt-4o-mini",), strict_models=True, **FAST)
    lenient = start_sim(models=("gpt-4o-mini",))
    unknown = chat_body(key_for("m"), model="gpt-5-imaginary")
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        chat = client.post("/chat/completions", json=unknown)
        known = client.post("/chat/completions", json=chat_body(key_for("m")))
        line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": unknown}
        file_id = upload(client, jsonl([line])).json()["id"]
        create = client.post(
            "/batches",
            json={
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        good, _ = wait(client, submit(client, request_lines(chat_body, [key_for("b")])))
    with httpx.Client(base_url=lenient.base_url, timeout=5) as client:
        accepted = client.post("/chat/completions", json=unknown)

    expected = {
        "error": {
            "message": "The model `gpt-5-imaginary` does not exist or you do not have access "
            "to it.",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }
    assert (chat.status_code, chat.json()) == (404, expected)
    assert (create.status_code, create.json()) == (404, expected)
    assert known.status_code == 200 and good["status"] == "completed"
    assert accepted.status_code == 200
    meter = sim.meter.snapshot()
    assert meter.refusals_by_status == {404: 2}
    assert meter.refusals_by_endpoint == {"POST /v1/chat/completions": 1, "POST /v1/batches": 1}
    assert meter.batch_creates_total == 1  # the refused create made no batch


@pytest.mark.parametrize(
    ("kind", "code"),
    [("401", "invalid_api_key"), ("403", "unsupported_country_region_territory")],
)
def test_refusal_faults_cost_nothing_and_are_counted(
    start_sim, chat_body, key_for, kind, code
) -> None:
    key = key_for(kind)
    sim = start_sim(fault_by_key={key: kind}, tpm=60_000)
    headers = {"authorization": f"Bearer {WRONG_KEY}"}
    with httpx.Client(base_url=sim.base_url, timeout=5, headers=headers) as client:
        refused = client.post("/chat/completions", json=chat_body(key))
    assert refused.status_code == int(kind)
    assert refused.json()["error"]["code"] == code
    assert set(refused.json()["error"]) == OPENAI_ERROR_FIELDS
    meter = sim.meter.snapshot()
    assert meter.refusals_by_status == {int(kind): 1}
    assert meter.timestamps == () and meter.billed == {}  # no capacity consumed, nothing billed


def test_404_fault_names_the_requested_model(start_sim, chat_body, key_for) -> None:
    key = key_for("404")
    sim = start_sim(fault_by_key={key: "404"})
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        resp = client.post("/chat/completions", json=chat_body(key, model="gpt-4.1-nano"))
    assert resp.status_code == 404
    error = resp.json()["error"]
    assert error["code"] == "model_not_found" and "`gpt-4.1-nano`" in error["message"]


def test_refusal_faults_in_batch_lines_become_error_lines(
    start_sim: Callable[..., Simulator], chat_body, key_for
) -> None:
    keys = [key_for(f"b{i}") for i in range(4)]
    sim = start_sim(fault_by_key={keys[0]: "401", keys[1]: "403", keys[2]: "404"}, **FAST)
    with httpx.Client(base_url=sim.base_url, timeout=5) as client:
        batch, _ = wait(client, submit(client, request_lines(chat_body, keys)))
        errors = client.get(f"/files/{batch['error_file_id']}/content").text
    assert batch["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    assert all(f'"status_code": {s}' in errors for s in (401, 403, 404))
    assert [c.correlation_id for c in sim.meter.snapshot().billed.values()] == [keys[3]]
