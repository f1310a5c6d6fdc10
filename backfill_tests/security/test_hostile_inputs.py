"""Hostile values into every command's arguments and the files commands read: each ends in
exit 0, 1 (a failed check) or 2 (bad input, named), never in a traceback, and a refused
command leaves nothing where its command line pointed.

The commands and their arguments come from the CLI's own parser (``cli_commands.py``), so an
argument or a command added later is driven too. Commands run in this process against one
small SQLite store; what would start a server (``provider-sim``) only parses its options, and
``run`` and ``launch`` are given the flags that keep them quick (a canary of one post, a plan
that sends nothing, a webserver that refuses the connection).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic.fields import FieldInfo

from backfill_assets.cli import main
from backfill_assets.cli.commands.provider_sim import sim_options, sim_parser
from backfill_assets.config import reference as config_reference
from backfill_assets.config.reference import bounds, range_text
from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.config.variables import GROUPS
from backfill_assets.domain.policy.file import builtin_policy_text
from backfill_assets.ingest.importer import import_path
from backfill_assets.ledger.engines import engine_for
from backfill_tests.cli_commands import SERVERS, Command, Files, commands, harmless_argv
from backfill_tests.cli_runs import ROOT, clear_settings

CONFIGURATION = ROOT / "docs" / "configuration.md"

# Values no argument should choke on: numbers past every range, in every notation, other
# scripts' digits, control characters, paths that climb, and plenty of text.
FIXED = [
    "",
    " ",
    "-1",
    "0",
    "-0",
    "nan",
    "NaN",
    "sNaN",
    "inf",
    "-Infinity",
    "1e400",
    "1e999999999",
    "-1e999999999",
    "1e-999999999",
    "9" * 5000,
    "9" * 23,
    str(10**26),
    str(2**63),
    str(-(2**63) - 1),
    "0x10",
    "1_000",
    "1.5",
    "\u0661\u0660",  # Arabic-Indic 10
    "\uff11\uff10",  # fullwidth 10
    "\u00b2",
    "99999999999h",
    "2020-13-45",
    "10000-01-01T00:00Z",
    "\x00",
    "\x1b[2J\x1b[31mred",
    "a\nb",
    "../x",
    "/",
    "x" * 10_000,
]
# Not here: "\udcff", a byte of argv that is not UTF-8 as Python hands it over. A real
# process prints it back (stdout: surrogateescape under a UTF-8 locale; stderr:
# backslashreplace); pytest's capture is strict and would fail where the command does not.
hostile = st.one_of(
    st.sampled_from(FIXED),
    st.integers().map(str),
    st.floats().map(repr),
    st.decimals().map(str),
    st.text(max_size=40),
    st.from_regex(r"-?[0-9]{1,30}(\.[0-9]{1,5})?[dhms%]?", fullmatch=True),
).filter(lambda v: "\x00" not in v)  # an argv cannot hold NUL (C strings); files can
FAST = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# What keeps these commands quick whatever flag is tried (``harmless_argv`` adds the rest).
QUICK: dict[tuple[str, ...], list[str]] = {
    ("run",): ["--sample", "1"],
    ("launch",): ["--dry-run"],
}
# Flags that need others beside them to be read at all.
WITH: dict[str, list[str]] = {"--margin": ["--deadline", "36h"], "--deadline": ["--dry-run"]}
# Where a command may legitimately exit 1: a failed check or run.
MAY_FAIL = {("verify",), ("check",), ("usage",), ("launch",), ("run",), ("evaluate",)}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Files]:
    """One small store (three posts of one tenant) and harmless input files, for the module."""
    root = tmp_path_factory.mktemp("hostile")
    store = f"sqlite:///{root / 'store.db'}"
    with pytest.MonkeyPatch.context() as mp:
        clear_settings(mp)
        mp.setenv("BACKFILL_DATABASE_URL", store)
        mp.setenv("DAGSTER_HOME", str(root / "home"))
        mp.setenv("DAGSTER_WEBSERVER_URL", "http://127.0.0.1:1")  # refused at once
        mp.chdir(root)  # relative paths among the values stay in here
        found = Files.make(root / "files")
        import_path(engine_for(store), found.root / "posts.jsonl")
        yield found


def _cases() -> list[tuple[Command, argparse.Action]]:
    return [(c, a) for c in commands() if c.path not in SERVERS for a in c.actions()]


def _argv(cmd: Command, action: argparse.Action, value: str, files: Files) -> list[str]:
    """``cmd`` run quickly, with ``value`` for ``action`` (and harmless values elsewhere)."""
    base = harmless_argv(cmd, files, leave_out=action.dest)
    quick = [] if action.dest in ("sample", "deadline") else QUICK.get(cmd.path, [])
    if not action.option_strings:  # a positional: in its place among the others
        positionals = [a for a in cmd.actions() if not a.option_strings]
        at = len(cmd.path) + positionals.index(action)
        return [*base[:at], value, *base[at:], *quick]
    flag = action.option_strings[0]
    if cmd.path == ("demo-data",) and action.dest in ("posts", "tenants"):
        # A valid count is honoured: millions of posts would take minutes without refusing
        # anything, so a large valid one is asked as 1,000 (out-of-range ones stay as drawn).
        value = _at_most(value, 1_000, 10**7)
    if action.dest == "out":
        # Where a command writes: any name, but inside this test's directory.
        value = f"{files.out}/{value.replace('/', '_')}"
    return [*base, *quick, *WITH.get(flag, []), f"{flag}={value}"]


def _at_most(value: str, cap: int, limit: int) -> str:
    """``value``, or ``cap`` when it is plain digits between ``cap`` and ``limit``."""
    if not (value.isascii() and value.isdigit()):
        return value
    return str(cap) if cap < int(value) <= limit else value


def _holds(argv: list[str], files: Files, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 0, 2 (or 1 where a check may fail), no traceback, and when refused, nothing
    written where the command line pointed."""
    # What an earlier, valid call wrote (``demo-data --out=out/`` writes a file named out).
    if files.out.is_dir():
        shutil.rmtree(files.out)
    files.out.unlink(missing_ok=True)
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    allowed = {0, 2} | ({1} if tuple(argv[:1]) in MAY_FAIL else set())
    assert code in allowed, (argv[:6], code, err[-2000:])
    assert "Traceback" not in err + out
    if code == 2:
        assert not files.out.exists(), (argv[:6], err[-500:])


@pytest.mark.parametrize(
    ("cmd", "action"), _cases(), ids=lambda x: x.name if isinstance(x, Command) else x.dest
)
@FAST
@given(value=hostile)
def test_every_argument_takes_hostile_values(
    files: Files,
    capsys: pytest.CaptureFixture[str],
    cmd: Command,
    action: argparse.Action,
    value: str,
) -> None:
    _holds(_argv(cmd, action, value, files), files, capsys)


def test_every_argument_is_driven() -> None:
    # A command this module cannot fill would be missing from the cases: harmless_argv raises.
    names = {c.name for c, _ in _cases()}
    assert {"run", "tenant set-budget", "rejects", "usage", "launch", "check"} <= names
    flags = {f for _, a in _cases() for f in a.option_strings}
    assert {"--usd", "--tokens", "--limit", "--deadline", "--wait", "--sample"} <= flags


@FAST
@given(value=hostile)
def test_the_simulator_options_are_refused_or_make_a_simulator(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    # provider-sim serves until stopped: its options are read as the command reads them, and
    # what they give would start a simulator.
    for action in sim_parser()._actions:  # argparse has no public list of its arguments
        if action.nargs == 0 or not action.option_strings:
            continue
        options = sim_options([f"{action.option_strings[0]}={value}"])
        if isinstance(options, int):
            assert options == 2
        else:
            assert 0 <= options[2] <= 65_535
    assert "Traceback" not in capsys.readouterr().err


# ------------------------------------------------------------------------ the files commands read

scalars = st.one_of(st.sampled_from(FIXED), st.integers().map(str), st.text(max_size=30))
json_numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["1e999999999", "-1e999999999", "1e30", '"sNaN"', '"NaN"', "9" * 5000]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)


@FAST
@given(version=scalars, severity=scalars)
@example(version="9" * 5000, severity="1")
@example(version="2020-13-45", severity="9" * 5000)
def test_a_policy_file_with_hostile_scalars(
    files: Files, capsys: pytest.CaptureFixture[str], version: str, severity: str
) -> None:
    text = builtin_policy_text().replace('version: "1"', f"version: {json.dumps(version)[1:-1]}")
    text = text.replace("action: hide\n", f"action: hide\n    severity: {severity}\n", 1)
    path = files.root / "hostile-policy.yaml"
    path.write_text(text, "utf-8", errors="surrogatepass")
    _holds(["policy", "check", str(path)], files, capsys)
    _holds(["dry-run", "--policy", str(path)], files, capsys)


@FAST
@given(start=json_numbers, count=json_numbers, amount=json_numbers, depth=st.integers(0, 3))
@example(start="253402300800", count="1", amount="1", depth=0)
@example(start="-1", count="9" * 5000, amount='"sNaN"', depth=0)
@example(start="0", count="1", amount="1e999999999", depth=3)
def test_a_usage_report_with_hostile_numbers(
    files: Files,
    capsys: pytest.CaptureFixture[str],
    start: str,
    count: str,
    amount: str,
    depth: int,
) -> None:
    usage = (
        f'{{"data": [{{"start_time": {start}, "results": [{{"model": "m", '
        f'"num_model_requests": {count}, "input_tokens": {count}}}]}}]}}'
    )
    costs = (
        f'{{"data": [{{"start_time": 0, "results": [{{"object": "organization.costs.result", '
        f'"amount": {{"value": {amount}}}}}]}}]}}'
    )
    # 0: JSON Lines; 1: a list of pages; 2 and 3: nested past any reader.
    nest = {0: 0, 1: 0, 2: 1_000, 3: 100_000}[depth]
    body = f"{usage}\n{costs}\n" if depth != 1 else f"[{usage}, {costs}]"
    path = files.root / "hostile-report.json"
    path.write_text("[" * nest + body + "]" * nest)
    _holds(["usage", "--reconcile", str(path)], files, capsys)


@FAST
@given(price=json_numbers, day=scalars)
@example(price="1e999999999", day="2026-01-01")
@example(price="1e30", day="9999-12-31")
def test_a_price_file_with_hostile_numbers(
    files: Files,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    price: str,
    day: str,
) -> None:
    path = files.root / "hostile-prices.json"
    standard = f'{{"input": {price}, "output": 1, "cached_input": {price}}}'
    path.write_text(
        f'{{"fake-moderator-1": [{{"from": {json.dumps(day)}, "standard": {standard}}}]}}',
        errors="surrogatepass",
    )
    monkeypatch.setenv("BACKFILL_PRICES_PATH", str(path))
    for argv in (["dry-run"], ["usage", "--reprice"], ["run", "--sample", "1"]):
        _holds(argv, files, capsys)


@pytest.mark.parametrize(
    "gold",
    [
        "id,text,label\n" + "9" * 5000 + ",hello,ok\n",
        "id,text,label\n1,hello,\x1b[31mok\n2,\x00,spam\n",
        "id,text,label\n" + "".join(f"{i},t{i},ok\n" for i in range(50)) + '3,"unclosed,ok\n',
        '{"id": ' + "9" * 5000 + ', "text": "x", "label": "ok"}\n',
        '{"id": 1e999999999, "text": "x", "label": "ok"}\n' + "[" * 100_000 + "\n",
        "\ufeffid,text,label\n1,hello,ok\n",
    ],
)
def test_a_gold_set_with_hostile_values(
    files: Files, capsys: pytest.CaptureFixture[str], gold: str
) -> None:
    path = files.root / ("gold.jsonl" if gold.startswith("{") else "gold.csv")
    path.write_text(gold, "utf-8")
    _holds(["evaluate", str(path)], files, capsys)


@pytest.mark.parametrize(
    "posts",
    [
        '{"tenant_id": "acme", "post_id": ' + "9" * 5000 + ', "text": "x"}\n',
        '{"tenant_id": "acme", "post_id": 1e999999999, "text": "x"}\n',
        '{"tenant_id": "acme", "post_id": "p", "text": "x", "region": NaN}\n',
        "[" * 100_000 + "\n",
        "tenant_id,post_id,text\nacme," + "9" * 5000 + ",x\n",
    ],
)
def test_an_import_file_with_hostile_values(
    files: Files, capsys: pytest.CaptureFixture[str], posts: str
) -> None:
    path = files.root / ("hostile.csv" if posts.startswith("tenant_id,") else "hostile.jsonl")
    path.write_text(posts, "utf-8")
    _holds(["import", str(path)], files, capsys)


# ------------------------------------------------------------------ numbers from the environment


def _numeric_variables() -> list[str]:
    """``group.field`` of every numeric setting."""
    return [
        f"{group}.{name}"
        for group, cls in GROUPS.items()
        for name, info in cls.model_fields.items()
        if any(t in str(info.annotation) for t in ("int", "float", "Decimal"))
    ]


def _field(path: str) -> FieldInfo:
    group, name = path.split(".")
    return GROUPS[group].model_fields[name]


def test_every_numeric_variable_has_a_documented_range() -> None:
    for name in _numeric_variables():
        info = _field(name)
        assert range_text(info), f"{info.validation_alias}: give it ge/gt and le/lt"
        assert range_text(info) in config_reference.render(CONFIGURATION.read_text("utf-8"))


@pytest.mark.parametrize("name", _numeric_variables())
@FAST
@given(value=hostile)
def test_a_numeric_variable_is_in_its_range_or_refused(name: str, value: str) -> None:
    info = _field(name)
    group, field = name.split(".")
    assert isinstance(info.validation_alias, str)
    try:
        settings = Settings.from_env({info.validation_alias: value}, load_policy=False)
        found = getattr(getattr(settings, group), field)
    except SettingsError:
        return
    if found is None or found == info.default:
        return  # blank: the default
    limits = bounds(info)
    assert math.isfinite(found)
    assert found >= limits.get("ge", found) and found > limits.get("gt", found - 1)
    assert found <= limits.get("le", found) and found < limits.get("lt", found + 1)
