"""Two runs in two processes share one provider limit fairly, on the simulator.

A big tenant runs alone; a small one starts later in another process. Without sharing each
process would pace at the whole limit (429s), and FIFO would make the small tenant wait behind
the big one's queue; with sharing the small tenant finishes within 2x its fair-share time.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from backfill_assets.ledger.engines import engine_for
from backfill_tests.cli_runs import last_json
from backfill_tests.conftest import StartSim, import_records
from bench.common import ROOT

RPM = 600


def _worker(url: str, base: str, tenant: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "bench.shared_limit_bench",
        "--worker",
        "--url",
        url,
        "--base",
        base,
        "--tenant",
        tenant,
        "--rpm",
        str(RPM),
        "--concurrency",
        "32",
    ]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0
    doc: dict[str, float] = last_json(out)
    return doc


def test_a_small_tenant_gets_its_fair_share_next_to_a_big_one(
    tmp_path: Path, start_sim: StartSim
) -> None:
    sim = start_sim(rpm=RPM, tpm=100_000_000, latency_median_ms=100, latency_sigma=0.2)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    records = [
        {"tenant_id": t, "post_id": f"p{i}", "text": f"{t} {i}: fine, thanks"}
        for t, n in (("big", 250), ("small", 20))
        for i in range(n)
    ]
    import_records(engine_for(url), tmp_path, records)
    big = _worker(url, sim.base_url, "big")
    time.sleep(8.0)  # the big run owns the whole limit by now
    small = _result(_worker(url, sim.base_url, "small"))
    big_doc = _result(big)
    assert small["accepted"] == 20 and big_doc["accepted"] == 250
    fair_s = 20 / (RPM / 2) * 60.0  # its posts / (limit / active tenants)
    assert small["wall_s"] <= 2 * fair_s, small
    meter = sim.meter.snapshot()
    assert meter.responses_by_status.get(429, 0) <= 0.02 * meter.requests_total
