"""Tenant regions: set on import (the first wins, a conflicting line is rejected), moved by
``tenant set-region``, listed by ``tenant list``; and the region tag ``launch`` sends."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from backfill_assets.cli import main
from backfill_assets.dispatch.pipeline import RegionUnavailable, RunOptions
from backfill_assets.dispatch.routing import Lanes
from backfill_assets.domain.work.keys import SLICE_KEYS
from backfill_assets.ledger.run.tenants import tenant_regions
from backfill_tests.conftest import import_records
from backfill_tests.pipeline_helpers import FAST_RETRY, run


def _post(tenant: str, i: int, region: str | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"tenant_id": tenant, "post_id": f"p{i}", "text": f"{tenant} post {i}"}
    if region is not None:
        rec["region"] = region
    return rec


def _regions(engine: Engine) -> dict[str, str | None]:
    with engine.connect() as conn:
        return tenant_regions(conn, ["acme", "euco", "newco"])


def _rejects(engine: Engine) -> dict[int, str]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT line, reason FROM rejected_records")).all()
    return {int(r.line): str(r.reason) for r in rows}


def test_an_import_sets_a_region_once_and_rejects_lines_that_disagree(
    engine: Engine, tmp_path: Path
) -> None:
    first = import_records(
        engine,
        tmp_path,
        [
            _post("acme", 1),  # line 1: no region, none set
            _post("euco", 1, "eu"),  # line 2: euco's region is eu from here on
            _post("euco", 2),  # line 3: no region given: keeps eu
            _post("euco", 3, "us"),  # line 4: conflicts with line 2 in the same file
            _post("newco", 1, "Eu"),  # line 5: malformed
            _post("euco", 4, "eu"),  # line 6: agrees
        ],
    )
    assert (first.imported, first.rejected) == (4, 2)
    assert _regions(engine) == {"acme": None, "euco": "eu"}
    rejects = _rejects(engine)
    assert set(rejects) == {4, 5}
    assert "region 'us' conflicts with tenant euco's region 'eu'" in rejects[4]
    assert "does not match ^[a-z][a-z0-9-]{1,19}$" in rejects[5]
    with engine.connect() as conn:
        posts = {
            r[0]
            for r in conn.execute(sa.text("SELECT post_id FROM posts WHERE tenant_id = 'euco'"))
        }
    assert posts == {"p1", "p2", "p4"}  # the rejected line's post was not imported

    # A later file: acme gets its first region; euco's stays, a line that disagrees is refused.
    second = import_records(
        engine,
        tmp_path,
        [_post("acme", 2, "us-east"), _post("euco", 9, "ap"), _post("acme", 3)],
        name="later.jsonl",
    )
    assert (second.imported, second.rejected) == (2, 1)
    assert _regions(engine) == {"acme": "us-east", "euco": "eu"}


def test_a_moved_tenant_refuses_export_lines_with_its_old_region(
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import_records(engine, tmp_path, [_post("euco", 1, "eu")])
    monkeypatch.setenv("BACKFILL_DATABASE_URL", str(engine.url.render_as_string(False)))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    assert main(["tenant", "set-region", "euco", "eu-west", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "tenant": "euco",
        "region": "eu-west",
        "previous": "eu",
    }
    again = import_records(
        engine, tmp_path, [_post("euco", 1, "eu"), _post("euco", 2)], "again.jsonl"
    )
    assert (again.rejected, again.imported) == (1, 1)
    assert _regions(engine)["euco"] == "eu-west"


@pytest.fixture
def cli_env(engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Engine:
    """acme (default region) and euco (eu) imported; ``main`` reads os.environ."""
    import_records(
        engine, tmp_path, [_post("acme", i) for i in range(20)] + [_post("euco", 1, "eu")]
    )
    monkeypatch.setenv("BACKFILL_DATABASE_URL", engine.url.render_as_string(False))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    for name in ("BACKFILL_MODEL_BACKEND", "BACKFILL_MODEL_BASE_URL__AP"):
        monkeypatch.delenv(name, raising=False)
    return engine


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tenant", "set-region", "acme", "EU"], "argument REGION: region 'EU' does not match"),
        (["tenant", "set-region", "acme", "e"], "argument REGION: region 'e' does not match"),
        (["tenant", "set-region", "acme", "eu_west"], "does not match ^[a-z][a-z0-9-]{1,19}$"),
        (["tenant", "set-region", "acmee", "eu"], "unknown tenant 'acmee'; did you mean acme?"),
        (
            ["tenant", "set-region", "ACME", "eu"],
            "argument TENANT: invalid tenant id 'ACME'; did you mean acme?",
        ),
    ],
)
def test_set_region_refuses_bad_input_with_exit_2(
    cli_env: Engine, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("backfill-moderation tenant set-region: error: ") and message in err
    assert _regions(cli_env) == {"acme": None, "euco": "eu"}  # nothing changed


def test_set_region_accepts_any_well_formed_region_and_notes_a_missing_endpoint(
    cli_env: Engine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BACKFILL_MODEL_BACKEND", "openai")
    assert main(["tenant", "set-region", "acme", "ap"]) == 0
    out, err = capsys.readouterr()
    assert "acme: region ap (was none: default endpoint)" in out
    assert "BACKFILL_MODEL_BASE_URL__AP is not set here" in err
    monkeypatch.setenv("BACKFILL_MODEL_BASE_URL__AP", "http://127.0.0.1:9/v1")
    assert main(["tenant", "set-region", "acme", "ap"]) == 0
    assert capsys.readouterr().err == ""
    assert _regions(cli_env)["acme"] == "ap"


def test_tenant_list_shows_region_posts_done_and_billed(
    cli_env: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    reports, _ = run(cli_env, ["acme"])
    assert sum(r.stats.calls for r in reports) == 20
    assert main(["tenant", "list", "--json"]) == 0
    rows = {r["tenant"]: r for r in json.loads(capsys.readouterr().out)["tenants"]}
    assert rows["euco"] == {
        "tenant": "euco",
        "region": "eu",
        "posts": 1,
        "done": 0,
        "billed": 0,
        "billed_usd": "0.000000000",
        "budget_tokens": None,
        "budget_usd": None,
    }
    acme = rows["acme"]
    assert (acme["region"], acme["posts"], acme["done"]) == (None, 20, 20)
    with cli_env.connect() as conn:
        billed = conn.execute(
            sa.text(
                "SELECT sum(tokens_in + tokens_out) FROM ledger_events "
                "WHERE type = 'usage' AND tenant_id = 'acme'"
            )
        ).scalar_one()
    assert acme["billed"] == billed > 0
    assert main(["tenant", "--json", "list"]) == 0  # --json before the subcommand works too
    assert json.loads(capsys.readouterr().out)["tenants"][0]["tenant"] == "acme"
    assert main(["tenant", "list"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == [
        "tenant",
        "region",
        "posts",
        "done",
        "billed",
        "billed_usd",
        "budget_tokens",
        "budget_usd",
    ]
    assert table[2].split()[:4] == ["acme", "-", "20", "20"]
    assert table[3].split() == ["euco", "eu", "1", "0", "0", "0.000000000", "-", "-"]


def test_a_tenant_whose_region_has_no_lane_is_not_sent_anywhere(cli_env: Engine) -> None:
    """The pipeline without regional lanes: euco (eu) gets no call, acme completes."""
    with pytest.raises(RegionUnavailable) as info:
        run(cli_env, ["acme", "euco"], options=RunOptions(retry=FAST_RETRY, lanes=Lanes()))
    assert set(info.value.regions) == {"eu"} and len(info.value.regions["eu"]) == len(SLICE_KEYS)
    by_tenant: dict[str, int] = {}
    for rep in info.value.reports:
        by_tenant[rep.ref.tenant_id] = by_tenant.get(rep.ref.tenant_id, 0) + rep.stats.calls
    assert by_tenant == {"acme": 20, "euco": 0}
    with cli_env.connect() as conn:
        rows = conn.execute(sa.text("SELECT DISTINCT tenant_id FROM ledger_events")).all()
    assert [r[0] for r in rows] == ["acme"]


class _Webserver(BaseHTTPRequestHandler):
    """Every partition missing; records the tags of each launched backfill."""

    launched: list[dict[str, str]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        query, variables = body["query"], body.get("variables", {})
        node: dict[str, Any]
        if "launchPartitionBackfill" in query:
            tags = {t["key"]: t["value"] for t in variables["params"]["tags"]}
            type(self).launched.append(tags)
            data = {
                "launchPartitionBackfill": {
                    "__typename": "LaunchBackfillSuccess",
                    "backfillId": "b1",
                }
            }
            return self._send(data)
        if "staleStatusByPartition" in query:
            node = {"staleStatusByPartition": ["MISSING" for _ in variables["partitions"]]}
        elif "assetChecksOrError" in query:
            node = {"assetChecksOrError": {"__typename": "AssetChecks", "checks": []}}
        else:
            keys = [f"{s}|{t}" for s in SLICE_KEYS for t in ("acme", "euco")]
            node = {
                "__typename": "AssetNode",
                "partitionKeys": keys,
                "assetPartitionStatuses": {"__typename": "MultiPartitionStatuses", "ranges": []},
            }
        self._send({"assetNodeOrError": node})

    def _send(self, data: dict[str, Any]) -> None:
        payload = json.dumps({"data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def webserver() -> Iterator[str]:
    _Webserver.launched = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Webserver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_launch_tags_each_backfill_with_its_tenants_region(
    cli_env: Engine, webserver: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["launch", "--missing", "--url", webserver, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {b["tenant"]: b["tags"] for b in doc["backfills"]} == {
        "acme": {"tenant": "acme"},
        "euco": {"tenant": "euco", "region": "eu"},
    }
    assert _Webserver.launched == [{"tenant": "acme"}, {"tenant": "euco", "region": "eu"}]
