"""The pure parts of batch mode: chunk ids and limits, input lines, triage, settings."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.defs.resources import RunResource, RunSettings, resources
from backfill_assets.dispatch.batch.chunks import chunk_base, chunk_id, split
from backfill_assets.dispatch.batch.rows import LineRows
from backfill_assets.dispatch.batch.triage import Disposition, triage
from backfill_assets.dispatch.batch_options import BatchOptions
from backfill_assets.domain.work.faults import FaultHooks
from backfill_assets.domain.work.keys import Versions
from backfill_assets.ledger.run.submissions import LineRow
from backfill_assets.ledger.run.writer import EVENT_COLUMNS
from backfill_assets.providers.batch_wire import BatchObject, OutputLine, input_line, output_lines
from backfill_assets.providers.models.base import ModelRequest
from backfill_tests.dispatch.batch.conftest import RUBRIC, VERSIONS

KEYS = [f"{i:064x}" for i in range(5)]


def test_chunk_ids_depend_on_versions_partition_and_key_set_not_order() -> None:
    base = chunk_base(VERSIONS, "acme", 3, KEYS)
    assert base == chunk_base(VERSIONS, "acme", 3, list(reversed(KEYS)))
    other_model = Versions(VERSIONS.task_version, VERSIONS.key_version, "gpt-4.1-mini")
    variants = {
        chunk_base(other_model, "acme", 3, KEYS),
        chunk_base(VERSIONS, "globex", 3, KEYS),
        chunk_base(VERSIONS, "acme", 4, KEYS),
        chunk_base(VERSIONS, "acme", 3, KEYS[:-1]),
        # Length-prefixed: moving a boundary between fields changes the id.
        chunk_base(VERSIONS, "acme3", 3, KEYS),
    }
    assert base not in variants and len(variants) == 5
    assert chunk_id(base, 1) != chunk_id(base, 2)
    assert len(chunk_id(base, 12)) <= 64  # a metadata value, readable in a provider's console


@pytest.mark.parametrize(
    ("sizes", "max_lines", "max_bytes", "want"),
    [
        ([10] * 7, 3, 10_000, [3, 3, 1]),
        ([10] * 6, 3, 10_000, [3, 3]),
        ([40, 40, 40, 10], 100, 100, [2, 2]),
        ([500, 10, 10], 100, 100, [1, 2]),  # an oversized line gets a chunk of its own
        ([], 3, 100, []),
    ],
)
def test_split_respects_line_and_byte_limits(
    sizes: list[int], max_lines: int, max_bytes: int, want: list[int]
) -> None:
    spans = split(sizes, max_lines, max_bytes)
    assert [len(s) for s in spans] == want
    assert [i for s in spans for i in s] == list(range(len(sizes)))


def _request(key: str, text: str) -> ModelRequest:
    messages = RUBRIC.messages(key, text)
    return ModelRequest(key, "acme", "p1", 1, VERSIONS.model, messages, 64, 0, RUBRIC.contract)


def test_input_line_is_canonical_and_uses_the_sync_request_body() -> None:
    line = input_line(_request(KEYS[0], "héllo"), "max_tokens", logprobs=False)
    assert line == input_line(
        _request(KEYS[0], "héllo"), "max_tokens", logprobs=False
    ) and line.endswith(b"\n")
    item = json.loads(line)
    assert (item["custom_id"], item["method"], item["url"]) == (
        KEYS[0],
        "POST",
        "/v1/chat/completions",
    )
    assert item["body"]["response_format"]["json_schema"]["strict"] is True
    assert item["body"]["max_tokens"] == 64 and item["body"]["temperature"] == 0
    assert (
        "max_completion_tokens"
        in json.loads(input_line(_request(KEYS[0], "x"), "max_completion_tokens", logprobs=False))[
            "body"
        ]
    )


def _line(**fields: Any) -> OutputLine:
    return OutputLine.model_validate({"custom_id": KEYS[0], **fields})


def _completion(content: str, usage: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"id": "chatcmpl-1", "choices": [{"message": {"content": content}}]}
    if usage:
        body["usage"] = {"prompt_tokens": 120, "completion_tokens": 20}
    return body


def test_triage_of_every_line_shape() -> None:
    ok = triage(
        _line(response={"status_code": 200, "request_id": "req_1", "body": _completion("{}")})
    )
    assert (ok.disposition, ok.tokens_in, ok.tokens_out, ok.request_id) == (
        Disposition.ANSWERED,
        120,
        20,
        "req_1",
    )
    unreported = triage(_line(response={"status_code": 200, "body": _completion("{}", False)}))
    assert unreported.disposition is Disposition.ANSWERED and unreported.usage_shape == "missing"
    total = _completion("{}", False)
    total["usage"] = {"total_tokens": 90, "completion_tokens": None}
    only_total = triage(_line(response={"status_code": 200, "body": total}))
    assert (only_total.usage_shape, only_total.tokens_in, only_total.tokens_out) == ("total", 90, 0)
    assert (
        triage(_line(response={"status_code": 200, "body": "<html>"})).disposition
        is Disposition.RETRY
    )
    for status in (429, 500, 503, 408):
        error = {"error": {"message": "busy", "type": "server_error"}}
        assert (
            triage(_line(response={"status_code": status, "body": error})).disposition
            is Disposition.RETRY
        )
    rejected = triage(
        _line(
            response={
                "status_code": 400,
                "body": {"error": {"message": "bad 'secret post text'", "code": "invalid_value"}},
            }
        )
    )
    assert rejected.disposition is Disposition.REJECTED and rejected.message.startswith("HTTP 400")
    assert "secret post text" not in rejected.message  # quoted values are scrubbed
    expired = triage(_line(error={"code": "batch_expired", "message": "window passed"}))
    assert (expired.disposition, expired.message) == (
        Disposition.RETRY,
        "batch_expired: not run by the batch",
    )
    assert triage(None).disposition is Disposition.RETRY
    # One taxonomy with sync mode: our key, permission or model is no fault of the key.
    for status, code in ((401, "invalid_api_key"), (403, None), (404, "model_not_found")):
        body = {"error": {"message": "no", "code": code}}
        assert triage(_line(response={"status_code": status, "body": body})).disposition is (
            Disposition.FATAL
        )
    # The line's own request quoted back, unquoted: withheld; unknown request: nothing kept.
    post = "a post the provider quotes back verbatim"
    echo = {"error": {"message": f"Invalid content {post} here", "code": "invalid_value"}}
    echoed = triage(_line(response={"status_code": 400, "body": echo}), echoes=[post])
    assert post not in echoed.message and "withheld" in echoed.message
    unknown = triage(_line(response={"status_code": 400, "body": echo}), echoes=None)
    assert post not in unknown.message and "withheld" in unknown.message


def test_output_lines_join_on_custom_id_and_count_unreadable_lines() -> None:
    content = (
        json.dumps({"custom_id": "b", "response": {"status_code": 200, "body": {}}}).encode()
        + b"\nnot json\n\n"
        + json.dumps({"custom_id": "a", "error": {"code": "batch_expired"}}).encode()
    )
    found, unreadable = output_lines(content.splitlines())
    assert sorted(found) == ["a", "b"] and unreadable == 1


def test_batch_object_reads_terminal_states_and_errors() -> None:
    failed = BatchObject.model_validate(
        {
            "id": "batch_1",
            "status": "failed",
            "errors": {"data": [{"code": "token_limit_exceeded", "message": "m"}]},
            "extra_field": 1,
        }
    )
    assert failed.terminal and failed.errors is not None
    assert [e.code for e in failed.errors.data] == ["token_limit_exceeded"]
    assert not BatchObject.model_validate({"id": "b", "status": "finalizing"}).terminal


def test_ledger_rows_of_a_line_have_the_writers_columns() -> None:
    builder = LineRows(VERSIONS, "run", "acme", 3, "s03|acme", "ck-x-1")
    line = LineRow(7, KEYS[0], "p1", "h" * 64, 2)
    attempt, error = builder.attempt(line), builder.error(line, 500, "m" * 1000)
    assert set(EVENT_COLUMNS) - {"at"} <= set(attempt) and attempt["attempt_id"] == "ck-x-1:7"
    assert (attempt["post_id"], error["post_id"], len(error["message"])) == ("p1", None, 300)
    assert error["attempt_id"] == attempt["attempt_id"] and attempt["attempt_no"] == 2


def test_batch_options_and_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="max lines"):
        BatchOptions(max_lines=50_001)
    with pytest.raises(ValueError, match="kill point"):
        FaultHooks(kill_after_usage=0, kill_at="later")
    base = {"BACKFILL_DATABASE_URL": "sqlite:///:memory:"}
    settings = RunResource.of(
        Settings.from_env(
            {
                **base,
                "BACKFILL_DISPATCH": "batch",
                "BACKFILL_BATCH_MAX_LINES": "500",
                "BACKFILL_BATCH_POLL_SECONDS": "2.5",
                "BACKFILL_KILL_AT": "poll",
                "BACKFILL_MODEL_BACKEND": "openai",
            }
        )
    )
    assert (
        settings.batch.dispatch,
        settings.batch.batch_max_lines,
        settings.batch.batch_poll_seconds,
    ) == (
        "batch",
        500,
        2.5,
    )
    assert settings.run_options().dispatch_mode == "batch"
    assert (
        RunResource.of(Settings.from_env(base)).run_options().batch is None
    )  # sync stays the default
    for name, value in [
        ("BACKFILL_DISPATCH", "async"),
        ("BACKFILL_BATCH_MAX_LINES", "50001"),
        ("BACKFILL_BATCH_POLL_SECONDS", "0"),
    ]:
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({**base, name: value})
    # Fault hooks come from the environment only: they are no resource config (launchpad).
    assert Settings.from_env({"BACKFILL_KILL_AT": "poll"}).drills.faults().kill_at == "poll"
    with pytest.raises(SettingsError, match="BACKFILL_KILL_AT"):
        Settings.from_env({"BACKFILL_KILL_AT": "never"})
    fields = set(RunSettings.model_fields)
    assert not {f for f in fields if "kill" in f}, fields
    with pytest.raises(SettingsError, match="BACKFILL_MODEL_BACKEND=openai"):
        Settings.from_env({**base, "BACKFILL_DISPATCH": "batch"})
    openai = {
        **base,
        "BACKFILL_DISPATCH": "batch",
        "BACKFILL_MODEL_BACKEND": "openai",
        "BACKFILL_MODEL_BASE_URL": "http://127.0.0.1:9/v1/",
    }
    built = resources(Settings.from_env(openai))
    options = built["settings"].run_options(built["model"])
    assert options.batch.endpoint.base_url == "http://127.0.0.1:9/v1"
    assert "api_key" not in repr(options.batch.endpoint)


def test_batch_submissions_has_its_lookup_indexes(engine: Engine) -> None:
    # Columns of every table: test_schema_mirror.py.
    indexes = {i["name"] for i in sa.inspect(engine).get_indexes("batch_submissions")}
    assert {"batch_submissions_by_base", "batch_submissions_by_partition"} <= indexes
