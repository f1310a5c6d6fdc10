"""BACKFILL_PG_DEAD_PEER_SECONDS: one figure sets TCP keepalives and ``tcp_user_timeout`` on
both ends of every PostgreSQL connection: the store's engines and the Dagster instance's URL.

What a dead peer does to them is shown with a real network cut in ``test_host_cut.py``; here,
that the settings reach the sessions and the libpq connections.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qsl, urlsplit

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster_postgres import PostgresRunStorage

from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.defs.resources import resources
from backfill_assets.ledger.dead_peer import DeadPeer
from backfill_assets.ledger.engine import engine_dead_peer, make_engine
from backfill_tests.conftest import pg_database

SERVER = ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count")


def test_the_default_gives_up_on_a_silent_peer_within_15_seconds() -> None:
    peer = DeadPeer()
    assert peer.seconds == 15.0
    assert (peer.idle_s, peer.interval_s, peer.count) == (5, 3, 3)
    # Keepalives give up after idle + count x interval; sent data after the user timeout.
    assert peer.idle_s + peer.count * peer.interval_s <= peer.seconds
    assert peer.client_params() == {
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 3,
        "keepalives_count": 3,
        "tcp_user_timeout": 15000,
        "connect_timeout": 15,
    }
    assert peer.server_settings(150000) == {
        "tcp_keepalives_idle": 5,
        "tcp_keepalives_interval": 3,
        "tcp_keepalives_count": 3,
        "tcp_user_timeout": 15000,
    }
    # PostgreSQL 11 has no tcp_user_timeout: only the keepalives are set.
    assert "tcp_user_timeout" not in peer.server_settings(110000)


@pytest.mark.parametrize("seconds", [2.0, 4.0, 7.5, 60.0, 3600.0])
def test_every_figure_derives_settings_within_it(seconds: float) -> None:
    peer = DeadPeer(seconds)
    assert peer.idle_s >= 1 and peer.interval_s >= 1
    assert peer.user_timeout_ms == int(seconds * 1000)
    # tcp_user_timeout caps the keepalives' decision too (Linux), so the figure holds even
    # where 1 s probes cannot fit (2 s).
    assert peer.idle_s + peer.count * peer.interval_s <= max(seconds, 4.0)


@pytest.mark.parametrize("bad", [0.0, 1.9, float("nan"), float("inf")])
def test_a_figure_below_two_seconds_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="dead-peer seconds"):
        DeadPeer(bad)


def test_the_setting_is_read_once_and_checked() -> None:
    assert Settings.from_env({}).store.pg_dead_peer_seconds == 15.0
    assert (
        Settings.from_env({"BACKFILL_PG_DEAD_PEER_SECONDS": "6"}).store.pg_dead_peer_seconds == 6.0
    )
    for bad in ("1", "soon", "-5"):
        with pytest.raises(SettingsError, match="BACKFILL_PG_DEAD_PEER_SECONDS"):
            Settings.from_env({"BACKFILL_PG_DEAD_PEER_SECONDS": bad})
    store = resources(Settings.from_env({"BACKFILL_PG_DEAD_PEER_SECONDS": "6"}))["store"]
    assert store.pg_dead_peer_seconds == 6.0


def test_a_url_gets_what_it_lacks_and_keeps_what_it_has() -> None:
    peer = DeadPeer(6)
    url = "postgresql+psycopg2://u:p%40ss@db:5432/dagster?keepalives_idle=9&sslmode=require"
    got = peer.url_with_params(url)
    parts = urlsplit(got)
    assert parts.netloc == "u:p%40ss@db:5432" and parts.path == "/dagster"
    query = dict(parse_qsl(parts.query))
    assert query["keepalives_idle"] == "9" and query["sslmode"] == "require"
    assert query["keepalives"] == "1" and query["tcp_user_timeout"] == "6000"
    assert query["keepalives_interval"] == "1" and query["connect_timeout"] == "6"
    assert query["options"] == (
        "-c tcp_keepalives_idle=2 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3"
        " -c tcp_user_timeout=6000"
    )
    assert peer.url_with_params(got) == got  # idempotent: nothing left to add
    own = "postgresql+psycopg2://db/d?options=-c%20statement_timeout%3D0"
    assert "tcp_keepalives" not in peer.url_with_params(own)  # its own options are kept


@pytest.fixture
def pg_url(pg_available: bool) -> Iterator[str]:
    if not pg_available:
        pytest.skip("PostgreSQL not available (set BACKFILL_TEST_PG_URL)")
    with pg_database("bf_peer") as url:
        yield url


def _session(conn: sa.Connection) -> dict[str, str]:
    names = (*SERVER, "tcp_user_timeout", "application_name")
    return {n: str(conn.exec_driver_sql(f"SHOW {n}").scalar_one()) for n in names}


@pytest.mark.pg
def test_store_sessions_carry_the_settings_on_both_ends(pg_url: str) -> None:
    engine = make_engine(pg_url, DeadPeer(6))
    try:
        assert engine_dead_peer(engine).seconds == 6.0
        with engine.connect() as conn:
            shown = _session(conn)
            dsn = conn.connection.dbapi_connection.get_dsn_parameters()  # type: ignore[union-attr]
        # Over TCP (the tests' server is on 127.0.0.1) the server reports what was set.
        assert [shown[n] for n in SERVER] == ["2", "1", "3"]
        assert shown["tcp_user_timeout"] == "6000"
        assert shown["application_name"].startswith("backfill-moderation ")
        assert (dsn["keepalives"], dsn["keepalives_idle"], dsn["tcp_user_timeout"]) == (
            "1",
            "2",
            "6000",
        )
    finally:
        engine.dispose()
    # The operator's own values win, on both ends.
    own = f"{pg_url}?keepalives_idle=11&options=-c%20tcp_keepalives_idle%3D9"
    engine = make_engine(own, DeadPeer(6))
    try:
        with engine.connect() as conn:
            shown = _session(conn)
            dsn = conn.connection.dbapi_connection.get_dsn_parameters()  # type: ignore[union-attr]
        assert shown["tcp_keepalives_idle"] == "9" and shown["tcp_keepalives_count"] == "3"
        assert dsn["keepalives_idle"] == "11" and dsn["keepalives_interval"] == "1"
    finally:
        engine.dispose()


@pytest.mark.pg
def test_dagster_storage_takes_the_settings_from_its_url(pg_url: str) -> None:
    # dagster-postgres accepts no connect arguments or session hooks: the URL carries libpq's
    # client parameters and, as startup options, the server side.
    url = DeadPeer(6).url_with_params(pg_url)
    storage = PostgresRunStorage(url)
    try:
        with storage.connect() as conn:
            shown = _session(conn)
        assert [shown[n] for n in SERVER] == ["2", "1", "3"]
        assert shown["tcp_user_timeout"] == "6000"
        storage.add_run(dg.DagsterRun(job_name="probe"))  # and it works as storage
        assert len(storage.get_runs()) == 1
    finally:
        storage.dispose()
