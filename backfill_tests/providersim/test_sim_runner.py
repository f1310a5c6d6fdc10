"""Lifecycle of the simulator and its command-line entry points."""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys

import httpx
import pytest

from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providersim import (
    FaultRule,
    SimConfig,
    Simulator,
    add_cli_arguments,
    config_from_args,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="provider-sim")
    add_cli_arguments(parser)
    return parser


def test_cli_arguments_build_the_config_and_keep_fault_order() -> None:
    argv = shlex.split(
        "--port 9001 --rpm 60 --tpm 9000 --latency-ms 200 --latency-sigma 0.4 --seed 5 "
        "--fault 500=0.1 --fault-sticky reset=0.2 --fault 503=0.05 --burst-seconds 2 "
        "--api-key sk-x --hang-seconds 3"
    )
    ns = _parser().parse_args(argv)
    assert (ns.host, ns.port) == ("127.0.0.1", 9001)
    assert config_from_args(ns) == SimConfig(
        rpm=60,
        tpm=9000,
        latency_median_ms=200,
        latency_sigma=0.4,
        seed=5,
        burst_seconds=2,
        api_key="sk-x",
        hang_seconds=3,
        faults=(
            FaultRule(kind="500", rate=0.1),
            FaultRule(kind="reset", rate=0.2, sticky=True),
            FaultRule(kind="503", rate=0.05),
        ),
    )


def test_cli_defaults_are_an_unlimited_faultless_simulator() -> None:
    ns = _parser().parse_args([])
    assert ns.port == 8799
    assert config_from_args(ns) == SimConfig()


@pytest.mark.parametrize(
    "argv",
    [
        ["--fault", "500"],
        ["--fault", "teapot=0.1"],
        ["--fault-sticky", "500=lots"],
        ["--fault", "500=1.5"],
        ["--rpm", "-1"],
        ["--burst-seconds", "0"],
        ["--latency-ms", "nan"],
    ],
)
def test_cli_rejects_invalid_values(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(argv)
    assert argv[0] in capsys.readouterr().err


def test_run_forever_announces_its_url_and_exits_on_sigterm() -> None:
    code = (
        "from backfill_assets.providersim import SimConfig, run_forever\n"
        "run_forever(SimConfig(), host='127.0.0.1', port=0)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        prefix = "provider-sim listening on "
        assert line.startswith(prefix), line
        base_url = line.removeprefix(prefix)
        assert httpx.get(f"{base_url}/models", timeout=5).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_simulator_lifecycle() -> None:
    sim = Simulator(SimConfig())
    with pytest.raises(RuntimeError):
        _ = sim.base_url
    with sim:
        port = sim.port
        assert sim.base_url == f"http://127.0.0.1:{port}/v1"
        assert httpx.get(f"{sim.base_url}/models", timeout=5).status_code == 200
        with pytest.raises(RuntimeError, match="failed to start"):
            Simulator(SimConfig(), port=port).start()  # port taken
    sim.stop()  # idempotent
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
    with sim:  # restartable
        assert httpx.get(f"{sim.base_url}/models", timeout=5).status_code == 200


def test_the_real_command_serves_hostile_modes(chat_body, key_for) -> None:
    argv = [
        *("-m", "backfill_assets.cli", "provider-sim", "--port", "0"),
        *("--api-key", "sk-proj-right-key-000000000000", "--models", "gpt-4o-mini"),
        *("--strict-models", "--usage-shape", "total_only", "--prompt-token-factor", "3"),
    ]
    proc = subprocess.Popen(
        [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip().removeprefix("provider-sim listening on ")
        right = {"authorization": "Bearer sk-proj-right-key-000000000000"}
        wrong = {"authorization": "Bearer sk-proj-wrong-key-000000000000"}
        body = chat_body(key_for("cli"))
        with httpx.Client(base_url=base_url, timeout=5) as client:
            refused = client.post("/chat/completions", json=body, headers=wrong)
            unknown = client.post(
                "/chat/completions", json={**body, "model": "gpt-x"}, headers=right
            )
            ok = client.post("/chat/completions", json=body, headers=right)
            meter = client.get(base_url.removesuffix("/v1") + "/_sim/meter").json()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert refused.status_code == 401
    assert "provided: sk-proj-" + "*" * 18 + "0000." in refused.json()["error"]["message"]
    assert unknown.json()["error"]["code"] == "model_not_found"
    assert set(ok.json()["usage"]) == {"total_tokens"}
    [billed] = meter["billed"]
    assert billed["prompt_tokens"] == 3 * sum(
        count_tokens(m["content"]) + 4 for m in body["messages"]
    )
    assert (
        ok.json()["usage"]["total_tokens"] == billed["prompt_tokens"] + billed["completion_tokens"]
    )
    assert meter["refusals_by_status"] == {"401": 1, "404": 1}
