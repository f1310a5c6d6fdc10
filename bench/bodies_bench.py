"""Memory of reading a hostile answer: capped reading against reading it whole.

For each body shape of ``providersim.bodies`` (a 50 MB answer, a gzip body inflating to
200 MB, an endless chunked body cut by a 3 s timeout), one fresh process makes one chat call
and reports how much its peak RSS grew: through the adapter (capped at 1 MiB), and through a
plain ``httpx`` read of the whole body (what the adapter did before the cap).

    bench/run bodies [--size-mb 50] [--bomb-mb 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys

import httpx

from backfill_assets.domain.policy.rubric import MAX_OUTPUT_TOKENS, Rubric
from backfill_assets.providers.models.base import ModelRequest
from backfill_assets.providers.models.openai_http import OpenAIHttpModel
from backfill_assets.providers.models.timeouts import HttpTimeouts
from backfill_assets.providers.ratelimit import EndpointLimiter, LimiterConfig
from backfill_assets.providersim.bodies import BodyServer, BodyShape

SHAPES: tuple[BodyShape, ...] = ("huge", "gzip", "endless")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _capped(url: str) -> str:
    rubric, key = Rubric(), "d" * 64
    request = ModelRequest(
        key=key,
        tenant_id="acme",
        post_id="p1",
        attempt=1,
        model="gpt-4o-mini",
        messages=rubric.messages(key, "a post"),
        max_output_tokens=MAX_OUTPUT_TOKENS,
        estimated_tokens=500,
        contract=rubric.contract,
    )
    adapter = OpenAIHttpModel(
        base_url=url,
        model="gpt-4o-mini",
        limiter=EndpointLimiter(LimiterConfig()),
        timeouts=HttpTimeouts(connect=2.0, read=3.0, total=3.0),
    )
    try:
        await adapter.complete(request)
        return "answered"
    except Exception as exc:  # the figure is memory; the outcome is printed beside it
        return type(exc).__name__
    finally:
        await adapter.aclose()


async def _whole(url: str) -> str:
    async with httpx.AsyncClient(timeout=3.0) as client:
        try:
            response = await asyncio.wait_for(client.post(url + "/chat/completions", json={}), 3)
            return f"read {len(response.content) >> 20} MiB"
        except Exception as exc:
            return type(exc).__name__


def _child(shape: BodyShape, how: str, size: int) -> None:
    with BodyServer(shape, size=size) as url:
        before = _rss_mib()
        outcome = asyncio.run(_capped(url) if how == "capped" else _whole(url))
        grew = _rss_mib() - before
    print(json.dumps({"shape": shape, "how": how, "grew_mib": round(grew, 1), "outcome": outcome}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=50, help="size of the huge answer")
    parser.add_argument("--bomb-mb", type=int, default=200, help="inflated size of the gzip body")
    parser.add_argument(
        "--child", nargs=3, metavar=("SHAPE", "HOW", "SIZE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]))
        return
    print(
        f"{'body':<10} {'read whole: RSS growth':>24} {'capped: RSS growth':>20}  outcome (capped)"
    )
    for shape in SHAPES:
        size = (args.bomb_mb if shape == "gzip" else args.size_mb) << 20
        rows = {}
        for how in ("whole", "capped"):
            out = subprocess.run(
                [sys.executable, "-m", "bench.bodies_bench", "--child", shape, how, str(size)],
                capture_output=True,
                text=True,
                timeout=300,
                check=True,
            )
            rows[how] = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{shape:<10} {rows['whole']['grew_mib']:>20.1f} MiB {rows['capped']['grew_mib']:>16.1f} MiB"
            f"  {rows['capped']['outcome']}"
        )


if __name__ == "__main__":
    main()
