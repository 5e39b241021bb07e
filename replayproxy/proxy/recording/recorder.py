"""The recorder as the forwarding process sees it: a bounded queue and a pipe to a recorder process.

Building shapes and writing traces cost ~15 times what packing a capture costs (BENCHMARKS.md),
so they run in a child process (child.py) that never holds this process's GIL. The event
loop only samples, enqueues and counts (`wants`, `finished`); every 20 ms a timer packs what is
queued and hands it to a non-blocking socket transport. Nothing here waits on the child: past
`queue_records` / `queue_bytes` (queued here, in the pipe, or unread by the child) a record is
dropped and counted. The child's counts come back as reports and land in this process's metrics.
A child that dies is counted (its unwritten records dropped as `recorder_exited`), logged, and
started again after `retry_s`; `close` hands over everything queued and waits for the footer.
`failing` says whether recording keeps up: it turns on while the child is down or its trace
writing fails, when records wait in the pipe and the child has read nothing for `STUCK_S`, and
for `FAILING_WINDOW_S` after any record was dropped, for whatever reason.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import cast

from replayproxy.clock import Anchor, now_ns
from replayproxy.proxy.metrics import EndpointFigures, ProxyMetrics
from replayproxy.proxy.observe import Capture, RateLimitedLog
from replayproxy.proxy.prompt import PromptHasher
from replayproxy.proxy.recording import wire
from replayproxy.proxy.recording.core import trace_files
from replayproxy.proxy.recording.tally import Tally, apply
from replayproxy.proxy.settings import ProxySettings
from replayproxy.shape import ENDPOINTS
from replayproxy.tasks import spawn

_log = logging.getLogger("replayproxy.proxy")
_POLL_S = 0.02
STUCK_S = 2.0  # records waiting this long with nothing read: the recorder process is stuck
FAILING_WINDOW_S = 10.0  # a drop keeps `failing` on this long (a sustained problem keeps it on)


class _Child(asyncio.Protocol):
    """One recorder process and the proxy's end of its pipe."""

    def __init__(self, recorder: Recorder, process: subprocess.Popen[bytes]) -> None:
        self.recorder = recorder
        self.process = process
        self.transport: asyncio.Transport | None = None
        self.reader = wire.unpacker()
        self.sent = 0  # captures written to the pipe
        self.received = 0  # of those, read by the child
        self.settled = 0  # of those, written to a trace or dropped by the child
        self.reported = False  # a first report came: the child runs
        self.gone = False  # the pipe closed: the child ended (or is ending)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not its subclasses

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        for kind, payload in self.reader:
            if kind == wire.TALLY:
                self.recorder._report(self, Tally.from_record(payload))

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


class Recorder:
    """Implements observe.Observer; `start` on the running loop, `await close()` after the last exchange."""

    def __init__(
        self,
        settings: ProxySettings,
        metrics: ProxyMetrics,
        hasher: PromptHasher,
        *,
        sample: Callable[[], float] = random.random,
    ) -> None:
        assert settings.trace_dir is not None
        self._settings = settings
        self._metrics = metrics
        self._key = hasher.key
        self._sample = sample
        self._endpoints = settings.endpoints_recorded
        self._rate = settings.sample_rate
        self._queue: deque[Capture] = deque()  # bounded by finished(): queue_records and queue_bytes
        self._queued_bytes = 0
        self._piped_bytes = 0  # in the transport's buffer at the last look
        self._in_flight = 0  # captures in the pipe that the child has not read yet
        self._anchor = Anchor.take()  # offset 0 of the trace, whichever child writes it
        self._packer = wire.packer()
        self._child: _Child | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._close_timeout_s = 30.0
        self._rotate = False
        self._down = ""  # why no recorder process runs now; "" while one does
        self._child_failing = ""  # the running child's own state (trace writing fails)
        self._progress_ns = 0  # the child last read something, or something began waiting for it
        self._dropped_ns = 0  # of the last drop
        self._dropped_why = ""  # its reason (a DROP_REASONS name); "" before any drop
        self.failing_window_ns = int(FAILING_WINDOW_S * 1e9)
        self._log = RateLimitedLog(settings.log_interval_s)
        for endpoint in ENDPOINTS:
            metrics.recorded[endpoint] = EndpointFigures()
        metrics.queue_depth.set_function(lambda: len(self._queue) + self._in_flight)  # read at scrape time
        metrics.recording_failing.set_function(lambda: 1.0 if self.failing else 0.0)

    @property
    def failing(self) -> str:
        """Why records are being dropped or soon will be; "" while recording keeps up."""
        if self._down or self._child_failing:
            return self._down or self._child_failing
        now = now_ns()
        if self._in_flight and now - self._progress_ns > STUCK_S * 1e9:
            return f"stuck: the recorder process read nothing for over {STUCK_S:g} s"
        if self._dropped_why and now - self._dropped_ns < self.failing_window_ns:
            return f"dropping records ({self._dropped_why})"
        return ""

    @property
    def files(self) -> list[Path]:
        """This recorder's trace files, oldest first (by modification time, then name)."""
        return trace_files(self._settings)

    @property
    def pending(self) -> int:
        """Captures not yet read by the recorder process."""
        return len(self._queue) + self._in_flight

    @property
    def child_pid(self) -> int | None:
        """The running recorder process, if any (for tests and operators)."""
        child = self._child
        return child.process.pid if child is not None and child.process.poll() is None else None

    def start(self) -> None:
        """Start the recorder process and the timer that feeds it (call on the running loop)."""
        self._task = spawn(self._run(), name="recorder-pipe")

    # ------------------------------------------------------------------ forwarding path

    def wants(self, endpoint: str) -> bool:
        return endpoint in self._endpoints and (self._rate >= 1.0 or self._sample() < self._rate)

    def finished(self, capture: Capture) -> None:
        """Enqueue; the timer sends it: no syscall on the forwarding path, nothing to wait for."""
        size = capture.request_bytes + capture.response_bytes
        s = self._settings
        if (
            len(self._queue) + self._in_flight >= s.queue_records
            or self._queued_bytes + self._piped_bytes + size > s.queue_bytes
        ):
            self._dropped("queue_full", 1)
            return
        self._queued_bytes += size
        self._queue.append(capture)

    def rotate(self) -> None:
        """Close the current file now (SIGHUP); the next record opens a new one."""
        self._rotate = True

    async def close(self, timeout_s: float = 30.0) -> None:
        """Hand over what is queued, let the recorder process write it and the footer, and stop it."""
        self._closing = True
        self._close_timeout_s = timeout_s
        if self._task is not None:
            try:
                async with asyncio.timeout(timeout_s + 5.0):
                    await self._task
            except TimeoutError:
                self._kill()
        self._drop_queue()  # anything that ended after the last hand-over is counted, not lost silently

    # ------------------------------------------------------------------ the recorder process

    async def _run(self) -> None:
        final_try = True
        while True:
            child = await self._spawn()
            if child is not None:
                try:
                    if await self._feed(child):
                        return
                except Exception as e:  # noqa: BLE001 — fail open: a bug here must not end recording
                    self._log("pipe", f"the recorder pipe failed: {type(e).__name__}; restarting its process")
                    self._kill()
                await self._exited(child)
            if self._closing:
                if not final_try or not self._queue:
                    self._drop_queue()
                    return
                final_try = False
                continue
            deadline = now_ns() + int(self._settings.retry_s * 1e9)
            while not self._closing and now_ns() < deadline:
                await asyncio.sleep(_POLL_S)

    async def _spawn(self) -> _Child | None:
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "replayproxy.proxy.recording.child", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # its log lines come through the pipe; stderr stays for tracebacks
            )
        except OSError as e:
            ours.close()
            self._went_down(f"crash: cannot start the recorder process ({type(e).__name__})", 0)
            return None
        finally:
            theirs.close()
        child = _Child(self, process)
        try:
            await asyncio.get_running_loop().create_unix_connection(lambda: child, sock=ours)
        except OSError as e:
            ours.close()
            process.kill()
            process.wait()
            self._went_down(f"crash: cannot reach the recorder process ({type(e).__name__})", 0)
            return None
        config = wire.config_record(self._settings, self._key, self._anchor)
        child.write(self._packer.pack([wire.CONFIG, config]))
        self._child = child
        return child

    async def _feed(self, child: _Child) -> bool:
        """Send batches until closing (True once the child wrote everything and exited) or the child
        ends (False)."""
        while not child.gone:
            if self._closing:
                self._send(child)
                child.write(self._packer.pack([wire.CLOSE, None]))
                return await self._wait_closed(child)
            self._send(child)
            await asyncio.sleep(_POLL_S)
        return False

    def _send(self, child: _Child) -> None:
        if self._rotate:
            self._rotate = False
            child.write(self._packer.pack([wire.ROTATE, None]))
        queue = self._queue
        if queue:
            records = [wire.capture_record(queue.popleft()) for _ in range(len(queue))]
            if not self._in_flight:  # the child's reading is timed from now (it had nothing to do)
                self._progress_ns = now_ns()
            child.sent += len(records)
            self._in_flight += len(records)
            self._queued_bytes = 0
            child.write(self._packer.pack([wire.CAPTURES, records]))
        if child.transport is not None:
            self._piped_bytes = child.transport.get_write_buffer_size()

    async def _wait_closed(self, child: _Child) -> bool:
        deadline = now_ns() + int(self._close_timeout_s * 1e9)
        while not child.gone and now_ns() < deadline:
            await asyncio.sleep(_POLL_S)
        while child.process.poll() is None and now_ns() < deadline:
            await asyncio.sleep(_POLL_S)
        if child.process.poll() is None:
            self._kill()
            return False
        return child.process.returncode == 0 and child.settled == child.sent

    def _report(self, child: _Child, tally: Tally) -> None:
        """A report from a recorder process: its counts into the metrics, its log lines logged here."""
        child.received += tally.received
        child.settled += tally.settled
        for reason, n in tally.dropped.items():
            self._dropped(reason, n, counted=True)
        if child is self._child:
            if tally.received:
                self._progress_ns = now_ns()
            self._in_flight = max(0, child.sent - child.received)
            self._child_failing = tally.failing
            if not child.reported:
                child.reported = True
                self._down = ""
        apply(tally, self._metrics)
        for level, line in tally.logs:
            _log.log(level, "%s", line)

    async def _exited(self, child: _Child) -> None:
        """Count what a dead recorder process took with it; the next one starts after retry_s."""
        if child.transport is not None:
            child.transport.abort()
        deadline = now_ns() + 2_000_000_000
        while child.process.poll() is None and now_ns() < deadline:  # its pipe closed: it is ending
            await asyncio.sleep(_POLL_S)
        if child.process.poll() is None:
            child.process.kill()
        code = child.process.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
        self._child = None
        self._in_flight = 0
        self._child_failing = ""
        self._went_down(f"crash: the recorder process exited ({how})", child.sent - child.settled)

    def _went_down(self, why: str, lost: int) -> None:
        self._down = why
        self._metrics.count_recorder_error("crash")
        if lost > 0:
            self._dropped("recorder_exited", lost)
        retry = "" if self._closing else f"; starting another in {self._settings.retry_s:g} s"
        self._log("exited", f"recording failed ({why}): {lost} records lost; traffic unaffected{retry}")

    def _drop_queue(self) -> None:
        if self._queue:
            self._dropped("recorder_exited", len(self._queue))
            self._queue.clear()
            self._queued_bytes = 0

    def _dropped(self, reason: str, n: int, *, counted: bool = False) -> None:
        """Count a drop (unless the child's report already did) and keep `failing` on for the window."""
        if not counted:
            self._metrics.records_dropped.labels(reason).inc(n)
        self._dropped_ns = now_ns()
        self._dropped_why = reason

    def _kill(self) -> None:
        child = self._child
        if child is not None and child.process.poll() is None:
            child.process.kill()
            child.process.wait()
