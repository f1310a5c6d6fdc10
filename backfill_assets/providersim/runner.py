"""Run the simulator: in a background thread (tests, benchmarks) or in the foreground (CLI)."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from types import TracebackType

from backfill_assets.providersim.app import SimApp
from backfill_assets.providersim.billing.meter import Meter
from backfill_assets.providersim.config import SimConfig
from backfill_assets.providersim.http import HttpServer

_log = logging.getLogger(__name__)
_START_TIMEOUT_SECONDS = 10.0
_STOP_TIMEOUT_SECONDS = 10.0


def _base_url(host: str, port: int) -> str:
    return f"http://{host}:{port}/v1"


class Simulator:
    """A provider simulator serving on its own event loop in a daemon thread."""

    def __init__(
        self,
        config: SimConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        meter: Meter | None = None,
    ) -> None:
        self.config = config if config is not None else SimConfig()
        # A benchmark may pass a Meter subclass to act the moment a request is recorded.
        self.meter = meter if meter is not None else Meter()
        self._host = host
        self._requested_port = port
        self._port: int | None = None
        self._app = SimApp(self.config, self.meter)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        """The bound port."""
        if self._port is None:
            raise RuntimeError("simulator is not running; call start() first")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``, the value for an OpenAI client's ``base_url``."""
        return _base_url(self._host, self.port)

    def start(self) -> Simulator:
        """Bind and serve in a background thread; returns once the port accepts connections."""
        if self._thread is not None:
            raise RuntimeError("simulator already started")
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name="providersim", daemon=True)
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_SECONDS):
            raise RuntimeError("provider simulator did not start in time")
        if self._error is not None:
            self._thread.join()
            self._thread = None
            raise RuntimeError("provider simulator failed to start") from self._error
        return self

    def stop(self) -> None:
        """Close every connection (hung requests too) and join the thread; idempotent."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
        thread.join(_STOP_TIMEOUT_SECONDS)
        self._thread = None
        self._port = None

    def reset(self) -> None:
        """Clear the meter and refill the rate-limit buckets (same as ``POST /_sim/reset``)."""
        loop = self._loop
        if loop is None or self._thread is None:
            self._app.reset()
            return
        # The buckets belong to the server's loop; touch them only from there.
        asyncio.run_coroutine_threadsafe(self._reset_on_loop(), loop).result(_STOP_TIMEOUT_SECONDS)

    async def _reset_on_loop(self) -> None:
        self._app.reset()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception as exc:
            if self._ready.is_set():
                _log.exception("provider simulator stopped on an error")
            else:  # A bind failure: start() re-raises it in the caller's thread.
                self._error = exc
                self._ready.set()

    async def _serve(self) -> None:
        server = HttpServer(self._app.router, max_body_bytes=self.config.max_body_bytes)
        self._port = await server.start(self._host, self._requested_port)
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await server.close()
            self._loop = None

    def __enter__(self) -> Simulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


async def _serve_until_signal(config: SimConfig, host: str, port: int) -> None:
    app = SimApp(config, Meter())
    server = HttpServer(app.router, max_body_bytes=config.max_body_bytes)
    bound = await server.start(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    # Scripts wait for this exact line before sending traffic.
    print(f"provider-sim listening on {_base_url(host, bound)}", flush=True)  # noqa: T201
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await server.close()


def run_forever(config: SimConfig, host: str = "127.0.0.1", port: int = 8799) -> None:
    """Serve in the foreground until SIGINT or SIGTERM (for the CLI)."""
    asyncio.run(_serve_until_signal(config, host, port))
