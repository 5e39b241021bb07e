"""Run the sim (or any server `serving_in_thread` is given) on its own event loop in a background
thread, for synchronous callers such as tests.

`with sim_thread(SimConfig(port=0)) as url:` serves until the block ends; the thread's loop is
separate, so clients in the calling thread (sync or with their own `asyncio.run`) see a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from replayproxy.sim.config import SimConfig
from replayproxy.sim.server import serving

Served = TypeVar("Served")


@contextlib.contextmanager
def sim_thread(config: SimConfig, startup_timeout: float = 10.0) -> Iterator[str]:
    """Serve `config` in a daemon thread and yield the base URL; stops and joins on exit."""
    with serving_in_thread(lambda: serving(config, shutdown_timeout=0.5), startup_timeout) as url:
        yield url


@contextlib.contextmanager
def serving_in_thread(
    serve: Callable[[], contextlib.AbstractAsyncContextManager[Served]], startup_timeout: float = 10.0
) -> Iterator[Served]:
    """Enter `serve()` on its own loop in a daemon thread and yield what it yields (a base URL, a
    server).

    The thread's loop is ended by `asyncio.run`, as a process's would be: handlers of requests
    still in flight are cancelled, not left pending for the garbage collector to log later."""
    ready = threading.Event()
    running: list[tuple[Served, asyncio.AbstractEventLoop, asyncio.Event]] = []
    failure: list[BaseException] = []

    async def main() -> None:
        stop = asyncio.Event()
        try:
            async with serve() as served:
                running.append((served, asyncio.get_running_loop(), stop))
                ready.set()
                await stop.wait()
        except BaseException as e:  # surfaced in the caller's thread below
            failure.append(e)
            raise

    def run() -> None:
        with contextlib.suppress(BaseException):
            asyncio.run(main())
        ready.set()

    thread = threading.Thread(target=run, name="replayproxy-server", daemon=True)
    thread.start()
    try:
        if not ready.wait(startup_timeout) or not running:
            raise RuntimeError(f"the server did not start: {failure[0] if failure else 'timeout'}")
        yield running[0][0]
    finally:
        if running:
            _, loop, stop = running[0]
            loop.call_soon_threadsafe(stop.set)
        thread.join(10)
