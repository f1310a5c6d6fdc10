"""No command shows, logs or stores a database password, whatever its characters.

SQLAlchemy takes a URL's password up to an '@', so it may hold '/', '?', '#', ':', '%' or
spaces; a password typed with a raw '@' is read in part as the host. Every command that takes
or prints a URL is driven with such passwords (raw and percent-encoded), in well-formed and
malformed URLs, on both stores: its output, the store's rows and every file under
``$DAGSTER_HOME`` must hold none of it, and a URL that does not parse ends in exit 2 saying so.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from backfill_assets.platform_db.sink import ddl
from backfill_tests.cli_runs import ROOT, clean_env, cli_with_env, run_cli
from backfill_tests.conftest import import_records, pg_database
from backfill_tests.security.scan import store_leaks, text_leaks, tree_leaks

# A marker, then anything printable: what separates a URL's parts above all.
_PRINTABLE = st.one_of(
    st.sampled_from([*"/?#@:% &=+[]", "%00", "%40"]),
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs"]),
)
PASSWORDS = st.lists(_PRINTABLE, min_size=1, max_size=16).map(lambda cs: "Zq7" + "".join(cs))

# How the password sits in the URL ({pw}); {db} is a sink that answers.
SHAPES = {
    "refused": "postgresql://app:{pw}@127.0.0.1:1/db",
    "answers": "{db}",
    "one slash": "postgresql:/app:{pw}@db/x",
    "no colon": "postgresql//app:{pw}@db/x",
    "open bracket": "postgresql://app:{pw}@[::1/db",
    "named port": "postgresql://app:{pw}@db:port/x",
}
MALFORMED = {"one slash", "no colon", "open bracket", "named port"}
# What the driver reads as a NUL: refused like a URL that does not parse.
NUL = "%00"
SQL = "--sql"
# The webserver's URL (a proxy's basic auth): read by httpx, which cuts it at the first '/'.
WEBSERVER = "--url"
# Every command that takes or prints a database URL, and where it reads it from.
COMMANDS: list[tuple[list[str], str]] = [
    (["sink", "check"], "BACKFILL_SINK_URL"),
    (["sink", "write", "--all"], "BACKFILL_SINK_URL"),
    (["sink", "ddl"], "BACKFILL_SINK_URL"),
    (["verify"], "BACKFILL_SINK_URL"),
    (["import", SQL, "--query", "SELECT 1 AS x", "--source", "platform"], SQL),
    (["tenant", "list"], "BACKFILL_DATABASE_URL"),
    (["tenant", "list"], "BACKFILL_SOURCE_URL"),
    (["launch", "--stale", WEBSERVER], WEBSERVER),
]


@dataclass
class Place:
    """A store with applied labels, its Dagster home, and a PostgreSQL sink that answers."""

    engine: Engine
    env: dict[str, str]
    home: Path
    sink_db: str

    def url(self, shape: str, password: str) -> str:
        """The URL of ``shape`` with ``password`` in it as given."""
        if shape == "answers":  # trust auth: any password is let in
            db = sa.engine.make_url(self.sink_db)
            return f"postgresql://{db.username}:{password}@{db.host}:{db.port}/{db.database}"
        return SHAPES[shape].format(pw=password)


@pytest.fixture
def place(engine: Engine, store_url: str, tmp_path: Path, pg_available: bool) -> Iterator[Place]:
    if not pg_available:
        pytest.skip("the sink that answers is a PostgreSQL database")
    records = [{"tenant_id": "acme", "post_id": f"p{i}", "text": f"post {i}"} for i in range(6)]
    import_records(engine, tmp_path, records)
    env = {"BACKFILL_DATABASE_URL": store_url, "DAGSTER_HOME": str(tmp_path / "home")}
    # In a child process: an instance this process held open would see the later runs' SQLite
    # files through stale shared memory.
    done = run_cli(["run"], clean_env(**env))
    assert done.returncode == 0, done.stderr[-2000:]
    with pg_database("bf_sink") as sink_db:
        sink = sa.create_engine(sink_db)
        with sink.begin() as conn:
            conn.exec_driver_sql(ddl("moderation_labels", "postgresql"))
        sink.dispose()
        yield Place(engine, env, tmp_path / "home", sink_db)


def _needles(password: str, encoded: bool) -> list[str]:
    # As typed, and as SQLAlchemy and the driver see it.
    seen = quote(password, safe="") if encoded else unquote(password)
    return sorted({password, seen})


def _leaks_in_store_and_home(place: Place, needles: list[str]) -> list[str]:
    return store_leaks(place.engine, needles, allowed=()) + tree_leaks(place.home, needles)


def test_no_command_shows_logs_or_stores_a_password(place: Place) -> None:
    used: list[str] = []

    @settings(max_examples=40, deadline=None, database=None)
    @given(
        password=PASSWORDS,
        encoded=st.booleans(),
        shape=st.sampled_from(sorted(SHAPES)),
        command=st.sampled_from(COMMANDS),
        as_json=st.booleans(),
    )
    def one(
        password: str, encoded: bool, shape: str, command: tuple[list[str], str], as_json: bool
    ) -> None:
        argv, where = command
        if where in ("BACKFILL_DATABASE_URL", WEBSERVER) and shape == "answers":
            shape = "refused"  # not a store: the command would migrate it
        url = place.url(shape, quote(password, safe="") if encoded else password)
        env = dict(place.env)
        if where == SQL:
            argv = [*argv[:2], url, *argv[2:]]
        elif where == WEBSERVER:
            argv = [*argv, url.replace("postgresql", "http", 1)]
        else:
            env[where] = url
        argv = [*argv, "--json"] if as_json else argv
        code, out, err = cli_with_env(argv, env)
        needles = _needles(password, encoded)
        used.extend(needles)
        assert code in (0, 1, 2) and "Traceback" not in out + err, (argv, url, err[-3000:])
        assert [n for n in needles if n in out + err] == [], (argv, url, out + err)
        # (A raw '@' can make a malformed URL parse: SQLAlchemy ignores what follows a host
        # it read.)
        plain = encoded or "@" not in password
        nul = not encoded and NUL in password
        if plain and (shape in MALFORMED or nul) and where != WEBSERVER:
            assert code == 2 and "is not a database URL" in err, (argv, url, err)

    one()
    assert _leaks_in_store_and_home(place, sorted(set(used))) == []


def test_a_run_writing_back_shows_logs_and_stores_no_password(place: Place) -> None:
    # In a child process, so Dagster's own logs and the compute logs are looked at too.
    # A raw '@': SQLAlchemy reads "host" as the sink's host, so the write-back fails, and
    # the failure is logged and kept in the run's event log.
    refused = "Zq7@host/db?x#y"
    env = {**place.env, "BACKFILL_SINK_URL": place.url("answers", refused)}
    done = run_cli(["run"], clean_env(**env))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    needles = _needles(refused, encoded=False)
    assert text_leaks("run", done.stdout + done.stderr, needles) == []
    assert _leaks_in_store_and_home(place, needles) == []
    # '/', '?', '#', '%', ':' and a space: the sink answers and the labels are written back.
    answered = "Sup3r/Se cr?et#1:%zz"
    env["BACKFILL_SINK_URL"] = place.url("answers", answered)
    done = run_cli(["run"], clean_env(**env))
    assert done.returncode == 0, done.stderr[-3000:]
    needles = _needles(answered, encoded=False)
    assert text_leaks("run", done.stdout + done.stderr, needles) == []
    assert _leaks_in_store_and_home(place, needles) == []
    code, out, err = cli_with_env(["verify", "--json"], env)
    assert code == 0 and text_leaks("verify", out + err, needles) == []
    db = sa.engine.make_url(place.sink_db)
    assert f"sink postgresql://{db.username}:***@{db.host}:{db.port}/{db.database} " in out


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("argv", "variable"),
    [
        (["sink", "check"], "BACKFILL_SINK_URL"),
        (["import", SQL, "--query", "SELECT 1", "--source", "platform"], SQL),
    ],
)
def test_a_url_that_does_not_parse_exits_2_naming_it_without_its_password(
    store_url: str, tmp_path: Path, argv: list[str], variable: str
) -> None:
    url = "postgresql://app:Sup3r/pw@[::1/db"
    env = clean_env(BACKFILL_DATABASE_URL=store_url, DAGSTER_HOME=str(tmp_path / "home"))
    if variable == SQL:
        argv = [*argv[:2], url, *argv[2:]]
    else:
        env[variable] = url
    done = run_cli(argv, env)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Sup3r" not in done.stdout + done.stderr
    assert "postgresql://app:***@[::1/db" in done.stderr and "is not a database URL" in done.stderr
    if variable != SQL:
        assert variable in done.stderr


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_dagster_instance_url_is_never_shown(store_url: str, tmp_path: Path) -> None:
    # An instance on PostgreSQL (DAGSTER_PG_URL), as production has it.
    home = tmp_path / "pg-home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster.postgres.yaml", home / "dagster.yaml")
    env = {"BACKFILL_DATABASE_URL": store_url, "DAGSTER_HOME": str(home)}
    password = "Zq7/se cr?et#1:%zz"
    for shape in sorted(MALFORMED):
        url = SHAPES[shape].format(pw=password)
        code, out, err = cli_with_env(["check", "--summary"], {**env, "DAGSTER_PG_URL": url})
        assert code == 2 and "DAGSTER_PG_URL=" in err and "is not a database URL" in err, err
        assert "Zq7" not in out + err
    # A server that does not answer: Dagster's retries and its error, in a child process.
    url = SHAPES["refused"].format(pw=password)
    done = run_cli(["check", "--summary"], clean_env(**env, DAGSTER_PG_URL=url))
    assert done.returncode == 2 and "cannot open the Dagster instance" in done.stderr
    assert "Traceback" not in done.stderr and "Zq7" not in done.stdout + done.stderr
