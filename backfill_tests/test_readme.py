"""The README and docs/*.md say what is true: their shell blocks run as written.

Every ```sh / ```bash block of README.md and then docs/*.md (in name order) runs top to
bottom, in one fresh Dagster home and store, from a scratch directory that links the
project's files (so relative paths like ``backfill_assets/demo/posts.jsonl`` work and nothing
is written into the checkout). A block is skipped only when the line before its fence is a
``<!-- needs: server ... -->`` comment: it starts or needs a long-running process (bin/dev,
bin/prod, the simulator, a webserver, a real provider) or is the whole suite (bin/test).

Two cheap checks keep the prose honest too: every ``backfill-moderation`` command and flag the
docs name exists in the CLI's parser, and every ``BACKFILL_*``/``DAGSTER_*`` variable the code
reads is in docs/configuration.md (and every one documented there exists).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from backfill_assets.cli import build_parser
from backfill_assets.cli.commands.provider_sim import sim_parser
from backfill_tests.cli_runs import ROOT, clean_env
from bench.layout_bench import settings_declared_again

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_MARK = re.compile(r"^<!--\s*needs:\s*server\b(.*?)-->$")
# What the scratch directory links, so the docs' relative paths resolve.
LINKED = (
    "backfill_assets",
    "bench",
    "bin",
    "deploy",
    "docs",
    "sql",
    "pyproject.toml",
    "workspace.yaml",
)
# Generous: ~30 s of CPU on a quiet machine, several minutes when the 2 cores are shared.
BLOCK_TIMEOUT_S = 480


@dataclass(frozen=True)
class Block:
    """A fenced shell block: where it is, what it says, and why it is skipped (if it is)."""

    path: Path
    line: int  # 1-based line of the opening fence
    script: str
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def shell_blocks(path: Path) -> list[Block]:
    """The ```sh and ```bash blocks of a Markdown file, in order."""
    lines = path.read_text("utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = lines[i].strip()
        if not fence.startswith("```"):
            i += 1
            continue
        lang = fence[3:].strip().split(" ")[0]
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        if lang in ("sh", "bash"):
            before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            mark = SKIP_MARK.match(before)
            skip = (mark.group(1).strip() or "(needs a server)") if mark else None
            blocks.append(Block(path, i + 1, "\n".join(lines[i + 1 : end]), skip))
        i = end + 1
    return blocks


def _scratch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    work = tmp_path / "project"
    work.mkdir()
    for name in LINKED:
        (work / name).symlink_to(ROOT / name)
    # As the other CLI tests do: nothing of the caller's BACKFILL_*/DAGSTER_* settings leaks in.
    env = clean_env()
    env.update(
        DAGSTER_HOME=str(tmp_path / "home"),
        BACKFILL_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        NO_COLOR="1",
    )
    (tmp_path / "home").mkdir()
    return work, env


def _run(block: Block, cwd: Path, env: dict[str, str]) -> None:
    # The ERR trap names the failing line of the block; -e stops at the first failure.
    script = "trap 'echo \"[doc-test] failed at block line $LINENO\" >&2' ERR\n" + block.script
    try:
        proc = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", script],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-3000:]
        pytest.fail(
            f"{block.where}: still running after {BLOCK_TIMEOUT_S} s (if it serves until "
            f"stopped, mark it <!-- needs: server -->)\n--- stdout\n{out!r}"
        )
    if proc.returncode != 0:
        found = re.search(r"failed at block line (\d+)", proc.stderr)
        line = block.line + int(found.group(1)) - 1 if found else block.line
        pytest.fail(
            f"{block.path.relative_to(ROOT)}:{line}: exit {proc.returncode} in the block at "
            f"{block.where}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        )


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_documented_shell_block_runs_as_written(tmp_path: Path) -> None:
    cwd, env = _scratch(tmp_path)
    blocks = [b for path in DOCS for b in shell_blocks(path)]
    ran, skipped = [], []
    for block in blocks:
        if block.skip is not None:
            skipped.append(f"{block.where} {block.skip}")
            continue
        started = time.monotonic()
        _run(block, cwd, env)
        ran.append(f"{block.where} ({time.monotonic() - started:.1f} s)")
    print("ran:\n  " + "\n  ".join(ran) + "\nskipped:\n  " + "\n  ".join(skipped))
    # The walkthrough is the point: a README whose every block is marked proves nothing.
    assert any(r.startswith("README.md:") for r in ran), skipped


def test_a_skip_needs_an_explicit_server_marker(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "<!-- needs: server (serves until stopped) -->\n```sh\nbin/dev\n```\n\n"
        "<!-- a comment -->\n```bash\necho hi\n```\n```sh\nexit 3\n```\n```yaml\na: 1\n```\n"
    )
    blocks = shell_blocks(doc)
    assert [(b.line, b.skip) for b in blocks] == [
        (2, "(serves until stopped)"),
        (7, None),
        (10, None),
    ]


# -- the prose: commands, flags and variables that exist ----------------------------------

_CLI_SPAN = re.compile(r"backfill-moderation((?:[ \t]+[^\s|;&`<>()]+|[ \t]*\\\n)*)")


def _parser_options() -> dict[str, set[str]]:
    """``{"run": {"--tenant", ...}, "tenant set-region": {...}, ...}`` from the real parser."""
    out: dict[str, set[str]] = {}

    def walk(parser: object, prefix: str) -> None:
        for action in getattr(parser, "_actions", []):
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict) and action.__class__.__name__ == "_SubParsersAction":
                for name, sub in choices.items():
                    path = f"{prefix} {name}".strip()
                    out[path] = {s for a in sub._actions for s in a.option_strings}
                    walk(sub, path)

    walk(build_parser(), "")
    # provider-sim's options belong to the simulator's own parser (loaded only for that command).
    out["provider-sim"] = {s for a in sim_parser()._actions for s in a.option_strings}
    return out


def test_every_documented_command_and_flag_exists() -> None:
    options = _parser_options()
    problems = []
    for path in DOCS:
        text = path.read_text("utf-8")
        for match in _CLI_SPAN.finditer(text):
            words = match.group(1).replace("\\\n", " ").split()
            if not words or words[0].startswith(("-", "[", "...")) or words[0] == "COMMAND":
                continue
            command = words[0]
            if len(words) > 1 and f"{command} {words[1]}" in options:
                command = f"{command} {words[1]}"
            line = text.count("\n", 0, match.start()) + 1
            if command not in options:
                problems.append(f"{path.name}:{line}: no command {command!r}")
                continue
            for word in words:
                flag = word.split("=")[0].strip("[]")
                if flag.startswith("--") and flag not in options[command]:
                    problems.append(f"{path.name}:{line}: {command} has no {flag}")
    assert not problems, "\n".join(problems)


_VAR = re.compile(r"\b(?:BACKFILL|DAGSTER)_[A-Z0-9_]*[A-Z0-9]\b(?!__)")
# Python names that look like variables but are not read from the environment.
_NOT_VARIABLES = {"BACKFILL_JOB", "BACKFILL_ASSETS"}


def _names(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for p in paths:
        found |= set(_VAR.findall(p.read_text("utf-8")))
    return found - _NOT_VARIABLES


def test_every_variable_is_in_docs_configuration() -> None:
    code = [
        *ROOT.glob("backfill_assets/**/*.py"),
        *(p for p in (ROOT / "bin").iterdir() if p.is_file()),
        *(p for p in (ROOT / "deploy").rglob("*") if p.is_file() and "__pycache__" not in p.parts),
        ROOT / "dagster.yaml",
    ]
    read_by_code = _names(code)
    config = (ROOT / "docs" / "configuration.md").read_text("utf-8")
    documented = set(_VAR.findall(config))
    missing = sorted(read_by_code - documented)
    assert not missing, f"read by the code, not in docs/configuration.md: {missing}"
    for pattern in ("BACKFILL_MODEL_BASE_URL__<REGION>", "BACKFILL_MODEL_API_KEY__<REGION>"):
        assert pattern in config
    # ... and nothing documented anywhere that the code (or the test setup) does not know.
    known = read_by_code | _names([ROOT / "backfill_tests" / "conftest.py"])
    regional = ("BACKFILL_MODEL_BASE_URL__", "BACKFILL_MODEL_API_KEY__")  # + a region suffix
    invented = sorted(n for n in _names(DOCS) - known if not n.startswith(regional))
    assert not invented, f"documented but read nowhere: {invented}"


def test_the_guarantee_table_names_modules_and_tests_that_exist() -> None:
    """docs/architecture.md maps each guarantee to its modules and tests: every path it names
    is a file (or package) in the tree, so a rename cannot leave the table pointing nowhere."""
    lines = (ROOT / "docs" / "architecture.md").read_text("utf-8").splitlines()
    start = lines.index("| guarantee | modules | tests |") + 2
    rows = lines[start : lines.index("", start)]
    assert len(rows) >= 10
    missing = []
    for row in rows:
        _, modules, tests = [c.strip() for c in row.strip("|").split("|")][:3]
        for name in re.findall(r"`([^`]+)`", modules):
            if not (ROOT / "backfill_assets" / name).exists():
                missing.append(name)
        for name in re.findall(r"`([^`]+)`", tests):
            if not (ROOT / "backfill_tests" / name).exists():
                missing.append(name)
    assert not missing, missing


def _layout_modules() -> set[str]:
    """The modules docs/architecture.md's Layout lists: paths rebuilt from its indentation."""
    text = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    found: set[str] = set()
    stack: list[str] = []
    for line in block.splitlines():
        if not line.strip() or not line.startswith(" "):
            stack = [line.split()[0].rstrip("/")] if line.strip() else []
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        name = line.split()[0]
        stack = stack[:depth]
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
        elif stack and stack[0] == "backfill_assets":
            found.add("/".join([*stack[1:], name]))
    return found


def test_the_layout_lists_every_module_and_no_other() -> None:
    package = ROOT / "backfill_assets"
    modules = {
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if p.name != "__init__.py" or p.parent == package
    }
    listed = _layout_modules()
    assert sorted(modules - listed) == [], "modules missing from docs/architecture.md's Layout"
    assert sorted(listed - modules) == [], "Layout lists modules that do not exist"


def test_no_folder_holds_more_than_fifteen_modules() -> None:
    crowded = {
        d.relative_to(ROOT).as_posix(): n
        for d in (ROOT / "backfill_assets").rglob("*")
        if d.is_dir() and (n := len(list(d.glob("*.py")))) > 15
    }
    assert crowded == {}


# Declaration tables, long because they list, not because they do many things. Each entry
# says why; a module leaves the list when it shrinks below the limit.
_LONG_MODULES = {
    # Every environment variable, declared once with its meaning and range (issue 47).
    "config/variables.py",
}
_MAX_MODULE_LINES = 400


def test_no_module_exceeds_four_hundred_lines() -> None:
    package = ROOT / "backfill_assets"
    long = {
        p.relative_to(package).as_posix(): n
        for p in package.rglob("*.py")
        if (n := len(p.read_text("utf-8").splitlines())) > _MAX_MODULE_LINES
    }
    assert {m: n for m, n in long.items() if m not in _LONG_MODULES} == {}
    # An allowance nobody needs any more is removed, so the list stays short and true.
    assert sorted(_LONG_MODULES - set(long)) == []


def test_no_setting_is_declared_twice(tmp_path: Path) -> None:
    # A setting's default lives in its group (config/variables.py); a layer below takes the
    # group or the value, never a literal default of its own (bench/run layout's rule).
    assert settings_declared_again(sorted((ROOT / "backfill_assets").rglob("*.py"))) == []
    # The rule finds one: a parameter and a field named as settings, with their own defaults.
    planted = tmp_path / "planted.py"
    planted.write_text(
        "class Limits:\n    rpm: int = 600\n\n\ndef send(concurrency: int = 8) -> None: ...\n"
    )
    found = settings_declared_again([planted], root=tmp_path)
    assert [f.split()[0] for f in found] == ["concurrency", "rpm"]


def test_every_path_the_scripts_name_exists() -> None:
    # A folder renamed under the scripts' feet once made .ci/smoke-python run no tests at all.
    scripts = [*sorted((ROOT / ".ci").iterdir()), *sorted((ROOT / "bin").iterdir())]
    named = {
        (script.name, path)
        for script in scripts
        if script.is_file()
        for path in re.findall(
            r"\b((?:backfill_tests|backfill_assets|bench|deploy|sql)/[\w./-]*\w)",
            script.read_text(),
        )
    }
    assert named, "the pattern finds nothing: the test would pass vacuously"
    assert sorted((s, p) for s, p in named if not (ROOT / p).exists()) == []
