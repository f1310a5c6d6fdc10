"""A local HTTP server speaking OpenAI's chat-completions format, with limits and faults.

Used by tests, demos and benchmarks in place of a real provider::

    with Simulator(SimConfig(rpm=3000, seed=7)) as sim:
        client = httpx.Client(base_url=sim.base_url)
        ...
        sim.meter.snapshot().billed_tokens_total
"""

from backfill_assets.providersim.args import add_cli_arguments, config_from_args
from backfill_assets.providersim.config import FAULT_KINDS, FaultKind, FaultRule, SimConfig
from backfill_assets.providersim.meter import BilledCall, Meter, MeterSnapshot
from backfill_assets.providersim.runner import Simulator, run_forever

__all__ = [
    "FAULT_KINDS",
    "BilledCall",
    "FaultKind",
    "FaultRule",
    "Meter",
    "MeterSnapshot",
    "SimConfig",
    "Simulator",
    "add_cli_arguments",
    "config_from_args",
    "run_forever",
]
