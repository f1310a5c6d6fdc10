"""Cost follows the work: partitions with nothing to do never reach Dagster, the rest
are pooled into few runs, and slices fill by volume."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from backfill_assets.dispatch.pipeline import PartitionRef
from backfill_assets.domain.work.keys import level_for, partition_of, partition_slices, slice_of
from backfill_assets.runner.pooling import Box, PartitionPlan, pool
from backfill_tests.cli_runs import cli_doc
from backfill_tests.conftest import import_records


def _plans(needs: dict[str, list[int]], levels: dict[str, int]) -> list[PartitionPlan]:
    """Every partition of each tenant at its level; those in ``needs`` have work."""
    out = []
    for t, level in levels.items():
        for s in range(1 << level):
            ref = PartitionRef(f"s{s:02d}|{t}", t, s, level)
            out.append(PartitionPlan(ref, 1, 1, s in needs.get(t, []), ""))
    return out


def _order(levels: dict[str, int]) -> list[str]:
    return [f"s{s:02d}|{t}" for t, level in levels.items() for s in range(1 << level)]


def test_pool_merges_small_tenants_and_keeps_big_ones_apart() -> None:
    small = dict.fromkeys((f"t{i:03d}" for i in range(100)), 0)
    boxes = pool(_plans({t: [0] for t in small}, small), _order(small))
    assert boxes == [Box(tuple(_order(small)))]  # 100 one-partition tenants: one run
    # A big tenant's 16 partitions and ten small tenants: every key has work, one run.
    levels = {"big1": 4, **dict.fromkeys(list(small)[:10], 0), "big2": 4}
    needs = {"big1": list(range(16)), "big2": list(range(16)), **{t: [0] for t in small}}
    boxes = pool(_plans(needs, levels), _order(levels))
    assert boxes == [Box(tuple(_order(levels)))]
    # Only one slice of each big tenant has work: 15 idle partitions in between cost less
    # than a run of their own (RUN_COST 20), 40 do not.
    levels = {"a": 4, "b": 0}
    boxes = pool(_plans({"a": [0], "b": [0]}, levels), _order(levels))
    assert boxes == [Box(tuple(_order(levels)))]
    levels = {"a": 0, "idle": 4, "idle2": 4, "idle3": 3, "b": 0}
    boxes = pool(_plans({"a": [0], "b": [0]}, levels), _order(levels))
    assert boxes == [Box(("s00|a",)), Box(("s00|b",))]
    # A tenant the plan leaves out (run --tenant a --tenant c) is never inside a box: its
    # pending work would be sent too.
    chosen = {"a": 0, "c": 0}
    boxes = pool(_plans({"a": [0], "c": [0]}, chosen), ["s00|a", "s00|b", "s00|c"])
    assert boxes == [Box(("s00|a",)), Box(("s00|c",))]
    # Boxes stay bounded.
    many = dict.fromkeys((f"m{i:04d}" for i in range(1200)), 0)
    boxes = pool(_plans({t: [0] for t in many}, many), _order(many), max_partitions=500)
    assert [b.size for b in boxes] == [500, 500, 200]


@given(
    levels=st.lists(st.integers(0, 4), min_size=1, max_size=30),
    work=st.lists(st.booleans(), min_size=1, max_size=200),
    run_cost=st.integers(0, 40),
    max_partitions=st.integers(1, 60),
)
@settings(max_examples=200, deadline=None)
def test_pool_covers_the_work_with_the_cheapest_ranges(
    levels: list[int], work: list[bool], run_cost: int, max_partitions: int
) -> None:
    """Against a brute-force quadratic programme: the same cost, every partition with work
    in exactly one box, every box a stretch of the order within the bound."""
    tenants = {f"t{i:02d}": lvl for i, lvl in enumerate(levels)}
    order = _order(tenants)
    flags = [work[i % len(work)] for i in range(len(order))]
    needs: dict[str, list[int]] = {}
    for key, busy in zip(order, flags, strict=True):
        if busy:
            slice_name, _sep, tenant = key.partition("|")
            needs.setdefault(tenant, []).append(int(slice_name[1:]))
    boxes = pool(_plans(needs, tenants), order, run_cost, max_partitions)
    busy = [k for k, b in zip(order, flags, strict=True) if b]
    assert sorted(k for b in boxes for k in b.keys if k in set(busy)) == sorted(busy)
    for b in boxes:
        at = order.index(b.start)
        assert list(b.keys) == order[at : at + b.size] and b.size <= max_partitions
    pos = [i for i, b in enumerate(flags) if b]
    best = [0.0] + [float("inf")] * len(pos)
    for j in range(1, len(pos) + 1):
        for i in range(j):
            size = pos[j - 1] - pos[i] + 1
            if size <= max_partitions:
                best[j] = min(best[j], best[i] + run_cost + size)
    assert sum(run_cost + b.size for b in boxes) == best[-1]


def test_levels_split_partitions_and_keep_every_post_in_one() -> None:
    assert [level_for(n, 5000) for n in (1, 5000, 5001, 10_001, 40_001, 10**6)] == [
        0,
        0,
        1,
        2,
        4,
        4,
    ]
    for level in range(5):
        held = [s for p in range(16) for s in partition_slices(p, level)]
        assert sorted(held) == list(range(16))  # every stored slice in exactly one partition
        for s in range(16):
            assert s in partition_slices(partition_of(s, level), level)
    # A growing tenant's partitions split: a post's partition at level L+1 is within (mod) L's.
    for s in range(16):
        assert partition_of(s, 2) % 2 == partition_of(s, 1)


def _events(home: Path) -> int:
    instance = dg.DagsterInstance.from_config(str(home))
    with instance:
        return len(
            instance.event_log_storage.get_event_records(
                dg.EventRecordsFilter(dg.DagsterEventType.ASSET_MATERIALIZATION), limit=100_000
            )
        ) + len(instance.get_run_records())


def _registered(home: Path) -> list[str]:
    """The partitions of moderation_labels the instance holds, in its order."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return list(instance.get_dynamic_partitions("tenant_slices"))


def test_no_work_no_run_and_what_unskips_a_partition(
    engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tenants = [f"tenant-{i}" for i in range(6)]
    records = [
        {"tenant_id": t, "post_id": f"p{i}", "text": f"{t} says {i}"}
        for t in tenants
        for i in range(30)
    ]
    import_records(engine, tmp_path, records, slice_target=5000)  # each tenant: one partition
    home = tmp_path / "home"
    env = {"BACKFILL_DATABASE_URL": str(engine.url.render_as_string()), "DAGSTER_HOME": str(home)}

    first = cli_doc(["run", "--json"], env, capsys)
    assert first["exit"] == 0 and first["plan"]["runs"] == 1  # six tenants, one pooled run
    assert {r["partition"] for r in first["partitions"]} == {f"s00|{t}" for t in tenants}
    # Partitions exist only where posts do: one per small tenant, none to skip.
    assert first["skipped"] == []
    assert _registered(home) == [f"s00|{t}" for t in tenants]

    # Nothing to do: no run, no event.
    before = _events(home)
    again = cli_doc(["run", "--json"], env, capsys)
    assert again["exit"] == 0 and again["runs"] == [] and again["partitions"] == []
    assert sum(s["reason"].startswith("nothing pending") for s in again["skipped"]) == 6
    assert _events(home) == before

    # One new post: only its partition runs.
    import_records(
        engine,
        tmp_path,
        [{"tenant_id": "tenant-3", "post_id": "new", "text": "fresh"}],
        name="more.jsonl",
        slice_target=5000,
    )
    one = cli_doc(["run", "--json"], env, capsys)
    assert [r["partition"] for r in one["partitions"]] == ["s00|tenant-3"]
    assert one["totals"]["model_calls"] == 1 and len(one["runs"]) == 1

    # --force runs every partition that holds posts (0 calls: all keys are done).
    forced = cli_doc(["run", "--json", "--force"], env, capsys)
    assert len(forced["partitions"]) == 6 and forced["totals"]["model_calls"] == 0

    # A new code version (another model) un-skips every partition.
    changed = cli_doc(["run", "--json"], {**env, "BACKFILL_MODEL": "fake-moderator-2"}, capsys)
    assert len(changed["partitions"]) == 6 and changed["totals"]["model_calls"] == 181


def test_a_tenant_that_grows_splits_its_partitions(
    engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    posts = [{"tenant_id": "acme", "post_id": f"p{i}", "text": f"post {i}"} for i in range(40)]
    import_records(engine, tmp_path, posts[:20], slice_target=10)  # 20 posts -> 2 partitions
    env = {
        "BACKFILL_DATABASE_URL": str(engine.url.render_as_string()),
        "DAGSTER_HOME": str(tmp_path / "home"),
    }
    first = cli_doc(["run", "--json"], env, capsys)
    assert sorted(r["partition"] for r in first["partitions"]) == ["s00|acme", "s01|acme"]
    assert _registered(tmp_path / "home") == ["s00|acme", "s01|acme"]
    import_records(engine, tmp_path, posts, name="all.jsonl", slice_target=10)  # 40 -> 4
    second = cli_doc(["run", "--json"], env, capsys)
    # Its extra slices are registered after it grew, and nothing else.
    assert _registered(tmp_path / "home") == [f"s0{i}|acme" for i in range(4)]
    # The 20 new keys are sent, the 20 done ones are not; partitions s02, s03 appear.
    assert second["totals"]["model_calls"] == 20
    ran = {r["partition"] for r in second["partitions"]}
    assert {"s02|acme", "s03|acme"} <= ran
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT post_id, slice FROM results")).all()
    assert len(rows) == 40 and all(s == slice_of("acme", p) for p, s in rows)
    verify = cli_doc(["verify", "--require-complete", "--json"], env, capsys)
    assert verify["exit"] == 0


def test_a_no_op_asks_the_instance_about_no_done_partition(
    engine: Engine,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Done partitions are marked in the store by the apply, so a no-op `run` skips them with
    one query; what un-marks a partition (a new materialisation that is not applied, a fresh
    instance) sends the plan back to the instance, which still has the last word."""
    tenants = [f"tenant-{i}" for i in range(4)]
    records = [
        {"tenant_id": t, "post_id": f"p{i}", "text": f"{t} {i}"} for t in tenants for i in range(5)
    ]
    import_records(engine, tmp_path, records, slice_target=5000)
    env = {
        "BACKFILL_DATABASE_URL": str(engine.url.render_as_string()),
        "DAGSTER_HOME": str(tmp_path / "home"),
    }
    assert cli_doc(["run", "--json"], env, capsys)["exit"] == 0
    with engine.connect() as conn:
        marks = conn.execute(sa.text("SELECT tenant_id, partition FROM partition_marks")).all()
    assert sorted(marks) == [(t, 0) for t in tenants]
    again = cli_doc(["run", "--json"], env, capsys)
    assert again["runs"] == [] and again["plan"]["asked_instance"] == 0  # asked about nothing

    # The labels of one partition materialise again and are not applied: no mark, so the
    # plan asks the instance, which says why it must run.
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM partition_marks WHERE tenant_id = 'tenant-2'"))
    redo = cli_doc(["run", "--json"], env, capsys)
    assert redo["plan"]["asked_instance"] == 1 and redo["runs"] == []  # still done: re-marked
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM partition_marks")).scalar_one() == 4

    # A fresh instance over the same store: the marks speak of another instance.
    fresh = cli_doc(["run", "--json"], {**env, "DAGSTER_HOME": str(tmp_path / "home2")}, capsys)
    assert len(fresh["partitions"]) == 4 and fresh["totals"]["model_calls"] == 0
