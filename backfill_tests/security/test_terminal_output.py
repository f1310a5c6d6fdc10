"""Text from outside (a file, a provider, the store) reaches a terminal with its control
characters escaped: a gold set's column name, a usage report's model name, a file name in an
error. ``--json`` stays valid JSON with the text exact."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from backfill_assets.cli import tables
from backfill_assets.cli.tables import show, show_csv, table, tell, terminal_text
from backfill_tests.cli_runs import cli_main
from backfill_tests.policy_helpers import COURSE_V5

# What a terminal may act on: C0 controls but the line feed, DEL, C1 controls (CSI, OSC...),
# and the bidirectional overrides and isolates that reorder what is shown.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
# Terminal tricks: clear the screen, set the title (OSC), a hyperlink, a C1 CSI, a bell, a
# carriage return that overwrites the line, a right-to-left override.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x1b]8;;http://evil.example\x1b\\x\x9b31m\rX\u202e\x7f"


def _no_raw_controls(*outputs: str) -> None:
    for text in outputs:
        assert not RAW_CONTROL.search(text), repr(text[-600:])


@pytest.fixture
def env(cli_store: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("BACKFILL_POLICY_PATH", str(COURSE_V5))
    return {**cli_store, "BACKFILL_POLICY_PATH": str(COURSE_V5)}


def test_a_gold_column_name_is_shown_escaped(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gold = tmp_path / "gold.jsonl"
    rows = [
        {"id": "g1", "text": "fine", "label": "ok"},
        {"id": "g2", "text": "fine", "label": "ok", HOSTILE: 1},
    ]
    gold.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = cli_main(["evaluate", str(gold)], capsys)
    assert code == 0, err
    _no_raw_controls(out, err)
    assert "unknown column(s): \\x1b[2J\\x1b]0;owned\\x07" in out  # readable, not dropped
    code, out, err = cli_main(["evaluate", str(gold), "--json"], capsys)
    [rejected] = json.loads(out)["rejected"]
    assert HOSTILE[:40] in rejected["reason"]  # JSON keeps the text exact, escaped by JSON
    _no_raw_controls(out, err)


def _report(model: str) -> str:
    result = {"object": "organization.usage.completions.result", "model": model}
    result |= {"num_model_requests": 1, "input_tokens": 10, "output_tokens": 2}
    return json.dumps({"object": "page", "data": [{"start_time": 86_400, "results": [result]}]})


def test_a_reconcile_model_name_is_shown_escaped(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    report.write_text(_report(f"gpt{HOSTILE}"))
    code, out, err = cli_main(["usage", "--reconcile", str(report)], capsys)
    assert code == 1, err  # the ledger has none of it: every figure differs
    _no_raw_controls(out, err)
    assert "gpt\\x1b[2J" in out
    code, out, err = cli_main(["usage", "--reconcile", str(report), "--json"], capsys)
    assert {d["model"] for d in json.loads(out)["differences"]} == {f"gpt{HOSTILE}"}
    _no_raw_controls(out, err)


def test_an_error_quoting_a_file_name_is_shown_escaped(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / f"no{HOSTILE.replace('/', '_')}.json"
    code, out, err = cli_main(["usage", "--reconcile", str(missing)], capsys)
    assert code == 2 and "cannot read" in err
    _no_raw_controls(out, err)


# Any text a cell, a title, a header or a line can carry.
_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)


@settings(max_examples=60, deadline=None)
@given(cells=st.lists(_TEXT, min_size=1, max_size=3), line=_TEXT, title=_TEXT)
def test_the_printing_layer_escapes_every_part(cells: list[str], line: str, title: str) -> None:
    rows = [{f"c{i}": v for i, v in enumerate(cells)}]
    columns = [f"c{i}" for i in range(len(cells))]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        show(table(rows, columns, title=title or None), line, table(rows, [cells[0] or "x"]))
        show_csv(line)
        tell(line)
    _no_raw_controls(out.getvalue(), err.getvalue())
    assert terminal_text(line) in out.getvalue() and terminal_text(line) in err.getvalue()
    # Printable text is left as it is: escaping never touches what a terminal cannot act on.
    plain = RAW_CONTROL.sub("", line)
    assert terminal_text(plain) == plain


def test_escaping_is_readable_and_styled_tables_keep_only_their_own_styles() -> None:
    assert terminal_text("a\x1b[31mb\x9b\x7f\u202e\tc\nd") == "a\\x1b[31mb\\x9b\\x7f\\u202e\\tc\nd"
    assert terminal_text("a\nb", lines=False) == "a\\nb"
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, width=120).print(
        table([{"model": HOSTILE}], ["model"], title=HOSTILE)
    )
    # On a terminal rich adds its own styles (SGR, ESC [ ... m); nothing else gets through.
    own_styles = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue())
    _no_raw_controls(own_styles)


def test_json_output_stays_json_and_escapes_every_control(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = {"model": HOSTILE + "\x00\x7f", HOSTILE: [1]}
    tables.emit(_Args(json=True), doc)
    out = capsys.readouterr().out
    assert json.loads(out) == doc
    _no_raw_controls(out)


class _Args:
    def __init__(self, json: bool) -> None:
        self.json = json


def test_the_cli_prints_only_through_the_printing_layer() -> None:
    # One place escapes: a print() or a direct write to stdout or stderr elsewhere in the CLI
    # would bypass it.
    cli = Path(tables.__file__).parent
    found = []
    for path in sorted(cli.glob("*.py")):
        if path.name == "tables.py":
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name == "print" or name.endswith(("stdout.write", "stderr.write")):
                    found.append(f"{path.name}:{node.lineno}: {name}")
    assert found == []
