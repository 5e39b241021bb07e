"""Listeners and lifecycle: the forwarding listener, the admin listener, the recorder, and signals.

SIGTERM (and SIGINT) stop accepting, let in-flight requests finish for up to `drain_timeout_s`,
cancel the rest, then flush and close the trace with its footer. SIGHUP rotates the trace file.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
from collections.abc import AsyncIterator

from replayproxy.config import ConfigError
from replayproxy.proxy import admin
from replayproxy.proxy.forward import TICK_S, Forwarder
from replayproxy.proxy.keys import load_key
from replayproxy.proxy.listener import Listener, bind
from replayproxy.proxy.metrics import ProxyMetrics
from replayproxy.proxy.observe import Observer, RateLimitedLog
from replayproxy.proxy.prompt import PromptHasher
from replayproxy.proxy.readiness import UpstreamProbe
from replayproxy.proxy.recording.recorder import Recorder
from replayproxy.proxy.settings import ProxySettings, parse_hostport
from replayproxy.tasks import spawn

_log = logging.getLogger("replayproxy.proxy")


class ProxyServer:
    """One running proxy: `await start()`, then `await stop()`; `url` and `admin_url` once started."""

    def __init__(self, settings: ProxySettings, observer: Observer | None = None) -> None:
        """`observer` replaces the recorder (tests observe captures directly)."""
        self.settings = settings
        if settings.record and settings.trace_dir is not None and settings.trace_dir.exists():
            if not settings.trace_dir.is_dir():
                raise ConfigError(f"trace_dir {settings.trace_dir} exists and is not a directory")
        self.metrics = ProxyMetrics()
        self.recorder: Recorder | None = None
        if settings.record and observer is None:
            hasher = PromptHasher(load_key(settings.hash_key_file), settings.tokenizer, settings.block_size)
            self.recorder = Recorder(settings, self.metrics, hasher)
        self.forwarder = Forwarder(
            settings,
            self.metrics.hot,
            observer or self.recorder,
            count_error=self.metrics.count_recorder_error,
        )
        self.url = ""
        self.admin_url = ""
        self._listener: Listener | None = None
        self._admin: admin.AdminServer | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._stopping = False
        self._tick_log = RateLimitedLog(settings.log_interval_s)

    async def start(self) -> None:
        host, port = parse_hostport(self.settings.listen, "listen")
        forwarder = self.forwarder
        forwarder.hot.client_connections = lambda: len(forwarder.clients)
        self._listener = Listener(
            bind(host, port, self.settings.backlog),
            forwarder.protocol,
            open_clients=forwarder.hot.client_connections,
            max_clients=self.settings.max_client_connections,
            refused=forwarder.hot.refused,
            log=forwarder.log,
        )
        self._listener.start()
        self.url = _url(host, self._listener.sock.getsockname()[1])
        if self.settings.admin_listen:
            admin_host, admin_port = parse_hostport(self.settings.admin_listen, "admin_listen")
            try:
                sock = admin.listen(admin_host, admin_port)
            except BaseException:
                self._listener.close()
                raise
            recorder = self.recorder
            health = admin.Health(
                accepting=lambda: not self.forwarder.draining,
                recording=lambda: recorder.failing if recorder is not None else "off",
                upstream=UpstreamProbe(self.settings.upstream, self.settings.upstream_health_path).check,
                ready_requires_recording=self.settings.ready_requires_recording,
            )
            self._admin = admin.AdminServer(sock, self.metrics, health)
            self._admin.start()
            self.admin_url = _url(admin_host, self._admin.port)
        if self.recorder is not None:
            self.recorder.start()
        self._start_ticker()

    def _start_ticker(self) -> None:
        self._ticker = spawn(self._tick(), name="proxy-timeouts")
        self._ticker.add_done_callback(self._ticker_ended)

    def _ticker_ended(self, task: asyncio.Task[None]) -> None:
        """Every timeout (header, connect, first byte, idle, keep-alive) hangs on this task: if it
        ends before `stop`, whatever ended it is logged and it starts again."""
        if self._stopping:
            return
        why = "cancelled" if task.cancelled() else type(task.exception()).__name__
        _log.error("the timeout task ended (%s); restarting it", why)
        self._start_ticker()

    async def _tick(self) -> None:
        """The forwarding timer; a failure is logged and the next tick runs (timeouts never stop)."""
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.forwarder.run_tick()
            except Exception as e:  # noqa: BLE001 — one failed sweep must not end all timeouts
                self._tick_log("tick", f"timeout sweep failed ({type(e).__name__}); next one in {TICK_S:g} s")

    def rotate(self) -> None:
        if self.recorder is not None:
            self.recorder.rotate()

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        """Stop accepting, drain, cancel what is left, close the trace."""
        timeout = self.settings.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        forwarder = self.forwarder
        if self._listener is not None:
            self._listener.close()
        forwarder.drain()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while forwarder.exchanges:
                    await asyncio.sleep(0.02)
        for client in list(forwarder.clients):
            client.abort()
        await asyncio.sleep(0)  # let connection_lost cancel what was aborted
        self._stopping = True
        if self._ticker is not None:
            self._ticker.cancel()
        forwarder.pool.close_idle()
        if self.recorder is not None:
            await self.recorder.close()
        if self._admin is not None:
            self._admin.close()


def raise_fd_limit() -> None:
    """Use every file descriptor the hard limit allows (like Go's runtime): one per client and one
    per upstream connection add up fast, and the soft limit is often 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextlib.asynccontextmanager
async def serving(settings: ProxySettings, observer: Observer | None = None) -> AsyncIterator[ProxyServer]:
    """Run a proxy on the current loop for the duration of the block (used by tests)."""
    server = ProxyServer(settings, observer)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(drain_timeout_s=1.0)


async def _serve(settings: ProxySettings, observer: Observer | None) -> int:
    server = ProxyServer(settings, observer)
    await server.start()
    # Everything allocated so far (imports, settings) lives as long as the process: moving it out of the
    # collector's reach turns the periodic full collection from ~50-100 ms (a stall of every stream) into
    # a scan of the few objects traffic creates.
    gc.freeze()
    print(f"proxy listening on {server.url}", flush=True)
    if server.admin_url:
        print(f"admin listening on {server.admin_url}", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, server.rotate)
    await stop.wait()
    _log.info("draining: %d requests in flight", len(server.forwarder.exchanges))
    await server.stop()
    _log.info("stopped")
    return 0


def run(settings: ProxySettings, observer: Observer | None = None) -> int:
    """Serve until SIGTERM/SIGINT on uvloop (plain asyncio where uvloop is unavailable); `observer`
    replaces the recorder (benchmarks/proxy_overhead.py measures a do-nothing one)."""
    raise_fd_limit()
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_serve(settings, observer))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_serve(settings, observer))
