"""Run the sim on its own event loop in a background thread, for synchronous callers such as tests.

`with sim_thread(SimConfig(port=0)) as url:` serves until the block ends; the thread's loop is
separate, so clients in the calling thread (sync or with their own `asyncio.run`) see a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from replayproxy.sim.config import SimConfig
from replayproxy.sim.server import serving


@contextlib.contextmanager
def sim_thread(config: SimConfig, startup_timeout: float = 10.0) -> Iterator[str]:
    """Serve `config` in a daemon thread and yield the base URL; stops and joins on exit."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    url: list[str] = []
    failure: list[BaseException] = []
    stop = asyncio.Event()

    async def main() -> None:
        try:
            async with serving(config, shutdown_timeout=0.5) as base:
                url.append(base)
                ready.set()
                await stop.wait()
        except BaseException as e:  # surfaced in the caller's thread below
            failure.append(e)
            raise

    def run() -> None:
        with contextlib.suppress(BaseException):
            loop.run_until_complete(main())
        ready.set()

    thread = threading.Thread(target=run, name="replayproxy-sim", daemon=True)
    thread.start()
    try:
        if not ready.wait(startup_timeout) or not url:
            raise RuntimeError(f"the sim did not start: {failure[0] if failure else 'timeout'}")
        yield url[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
