"""A run's stdout and stderr are captured as Dagster's local compute logs are, into the files
the UI reads, and still reach the terminal, mirrored by a thread: no ``tail`` or watcher
process (``compute_logs.py``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from dagster._core.instance.ref import InstanceRef

from backfill_assets.accelerators.compute_logs import MirroredComputeLogManager
from backfill_assets.runner.instance import INSTANCE_TEMPLATE
from backfill_tests.cli_runs import ROOT

# Run in a process of its own, its stdout and stderr pipes (the real file descriptors a CLI run
# has): a Dagster job on the embedded instance prints in every way a step can, then the
# process prints once more after the run. Any process started from Python fails the run.
_SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys
    import dagster as dg

    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[:1]}")

    subprocess.Popen.__init__ = no_process

    @dg.op
    def talk() -> None:
        print("print-out")
        print("print-err", file=sys.stderr)
        sys.stdout.flush()
        os.write(1, b"fd-out\\n")
        os.system("echo child-out")  # a child writing to the descriptor it inherited

    @dg.job
    def talking() -> None:
        talk()

    instance = dg.DagsterInstance.get()
    print(type(instance.compute_log_manager).__name__, flush=True)
    result = talking.execute_in_process(instance=instance)
    assert result.success
    [event] = [
        e for e in instance.all_logs(result.run_id)
        if e.dagster_event and e.dagster_event.event_type_value == "LOGS_CAPTURED"
    ]
    # The key the UI asks for a run's captured output by.
    manager = instance.compute_log_manager
    file_key = event.dagster_event.logs_captured_data.file_key
    data = manager.get_log_data(manager.build_log_key_for_run(result.run_id, file_key))
    print("captured-out=" + repr(data.stdout), flush=True)
    print("captured-err=" + repr(data.stderr), flush=True)
    print("after-run", flush=True)
    """
)


def test_a_run_is_captured_for_the_ui_and_mirrored_to_the_terminal_without_a_process(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_bytes(INSTANCE_TEMPLATE.read_bytes())
    env = {"PATH": "/usr/bin:/bin", "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert out[0] == "MirroredComputeLogManager"
    # The UI's copy: everything the step wrote, by Python, by descriptor and by a child.
    captured_out = next(line for line in out if line.startswith("captured-out="))
    for text in ("print-out", "fd-out", "child-out"):
        assert text in captured_out
    assert "print-err" in next(line for line in out if line.startswith("captured-err="))
    assert "after-run" not in captured_out
    # The terminal's: the same lines, mirrored before the run ended.
    mirrored = out[1 : out.index(next(line for line in out if line.startswith("captured-out=")))]
    for text in ("print-out", "fd-out", "child-out"):
        assert any(text in line for line in mirrored), (text, out)
    assert "print-err" in proc.stderr
    assert out[-1] == "after-run"


@pytest.mark.parametrize("config", ["deploy/dagster.postgres.yaml", "dagster.yaml"])
def test_both_instances_keep_the_logs_under_the_home_they_were_opened_with(
    config: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dagster.yaml").write_bytes((ROOT / config).read_bytes())
    # Not the home being opened: the logs must not follow it.
    monkeypatch.setenv("DAGSTER_HOME", "/elsewhere")
    monkeypatch.setenv("DAGSTER_PG_URL", "postgresql+psycopg2://nobody@127.0.0.1:1/none")
    manager = InstanceRef.from_dir(str(tmp_path)).compute_log_manager
    assert isinstance(manager, MirroredComputeLogManager)
    # Where Dagster's own default writes them.
    assert manager._base_dir == str(tmp_path / "storage")
