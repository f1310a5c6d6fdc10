"""Batch mode's money path: every usage shape booked like sync (never 0), each line's
upper bound reserved and stored, a line billed past its bound stops the tenant."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import Engine

from backfill_assets.domain.policy.rubric import call_token_bound
from backfill_assets.domain.work.keys import slice_of
from backfill_tests.conftest import import_records
from backfill_tests.dispatch.batch.conftest import (
    API_KEY,
    RUBRIC,
    StartSim,
    batch_options,
    key_of,
    records,
    rows,
    run_batch,
)
from backfill_tests.dispatch.batch.proxy import SimProxy


def _rewrite_usage(change: Callable[[str, dict[str, int]], object]) -> Callable[[bytes], bytes]:
    """Rewrites the ``usage`` of every answered line: ``change(key, usage)`` returns the new one
    (``None``: no usage at all)."""

    def rewrite(content: bytes) -> bytes:
        out = []
        for raw in content.splitlines():
            line = json.loads(raw)
            response = line.get("response") or {}
            body = response.get("body")
            if response.get("status_code") == 200 and isinstance(body, dict):
                usage = change(line["custom_id"], body["usage"])
                if usage is None:
                    del body["usage"]
                else:
                    body["usage"] = usage
            out.append(json.dumps(line).encode())
        return b"\n".join(out) + b"\n"

    return rewrite


def test_every_usage_shape_is_booked_and_lines_without_usage_at_their_bound(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme"], 18)
    import_records(engine, tmp_path, data)
    text_of = {key_of(r): r["text"] for r in data}
    keys = sorted(text_of)
    missing, total_only = set(keys[:6]), set(keys[6:12])

    def shapes(key: str, usage: dict[str, int]) -> object:
        if key in missing:
            return None
        if key in total_only:
            return {"total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
        return usage

    proxy = SimProxy(start_sim(), API_KEY)
    proxy.rewrite_content = _rewrite_usage(shapes)
    logs: list[str] = []
    run_batch(engine, ["acme"], batch_options(proxy.sim, transport=proxy.transport()), logs.append)

    meter = proxy.sim.meter.snapshot()
    billed = {c.correlation_id: c.total_tokens for c in meter.billed.values()}
    assert Counter(c.correlation_id for c in meter.billed.values()) == dict.fromkeys(keys, 1)
    bounds = {k: call_token_bound(RUBRIC, k, t) for k, t in text_of.items()}
    stored = dict(rows(engine, "SELECT key, bound_tokens FROM batch_lines"))
    assert stored == bounds  # each line's bound, stored with the line at intent
    usage = rows(
        engine,
        "SELECT key, tokens_in, tokens_out, usage_shape, bound_tokens, message"
        " FROM ledger_events WHERE type = 'usage'",
    )
    assert sorted(r.key for r in usage) == keys  # one usage event per key, none resubmitted
    for r in usage:
        assert r.bound_tokens == bounds[r.key]
        if r.key in missing:
            assert (r.usage_shape, r.tokens_in + r.tokens_out) == ("missing", bounds[r.key])
            assert r.message.startswith("usage_missing")
        elif r.key in total_only:
            assert (r.usage_shape, r.tokens_in, r.tokens_out) == ("total", billed[r.key], 0)
        else:
            assert r.usage_shape == "split" and r.tokens_in + r.tokens_out == billed[r.key]
    booked = sum(r.tokens_in + r.tokens_out for r in usage)
    [(tenant_billed,)] = rows(engine, "SELECT billed_tokens FROM tenants WHERE tenant_id='acme'")
    assert tenant_billed == booked > sum(billed.values())  # the missing ones at their bound
    assert {r.key for r in rows(engine, "SELECT key FROM results")} == set(keys)


def test_a_line_billed_past_its_bound_stops_the_tenant_for_the_run(
    engine: Engine, tmp_path: Path, start_sim: StartSim
) -> None:
    data = records(["acme", "globex"], 40)
    import_records(engine, tmp_path, data)
    # Two acme keys of one partition (so one chunk): one over-billed, one answered 500.
    by_slice: dict[int, list[str]] = defaultdict(list)
    for r in data:
        if r["tenant_id"] == "acme":
            by_slice[slice_of("acme", r["post_id"])].append(key_of(r))
    over, flaky = next(v for v in by_slice.values() if len(v) >= 2)[:2]
    proxy = SimProxy(start_sim(fault_by_key={flaky: "500"}), API_KEY)
    proxy.rewrite_content = _rewrite_usage(
        lambda key, usage: {**usage, "prompt_tokens": 10**6} if key == over else usage
    )
    logs: list[str] = []
    reports = run_batch(
        engine,
        ["acme", "globex"],
        batch_options(proxy.sim, transport=proxy.transport()),
        logs.append,
    )

    [event] = rows(
        engine,
        "SELECT tokens_in, bound_tokens, message FROM ledger_events WHERE key = :k"
        " AND type = 'usage'",
        k=over,
    )
    assert event.tokens_in == 10**6 and event.message.startswith("over_bound")
    assert any("over_bound" in line and "acme" in line for line in logs)
    sends = proxy.sim.meter.snapshot().calls_by_correlation_id
    assert sends[flaky] == 1  # not resubmitted: the tenant is stopped in this run
    acme = [r for r in reports if r.ref.tenant_id == "acme"]
    assert sum(r.stats.outcomes["deferred"] for r in acme) >= 1
    # Other tenants are not affected.
    globex = {key_of(r) for r in data if r["tenant_id"] == "globex"}
    assert globex <= {r.key for r in rows(engine, "SELECT key FROM results")}
