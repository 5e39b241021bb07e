"""The recorder: an observer whose work happens on its own thread, behind a bounded queue.

The event loop only samples, enqueues and counts (`wants`, `finished`). The thread builds shapes
(JSON, SSE, hashing), writes them through `TraceWriter`, applies retention, and survives any
failure: a full disk, an unwritable directory or a bug drops records (counted, logged once per
interval) while traffic flows, and writing resumes by itself after `retry_s`.
"""

from __future__ import annotations

import errno
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from replayproxy import __version__
from replayproxy.clock import Anchor, now_ns, wall_ns
from replayproxy.proxy.extract import build_shape
from replayproxy.proxy.links import SessionLinker
from replayproxy.proxy.metrics import EndpointFigures, ProxyMetrics
from replayproxy.proxy.observe import Capture, RateLimitedLog
from replayproxy.proxy.prompt import PromptHasher
from replayproxy.proxy.settings import ProxySettings
from replayproxy.shape import ENDPOINTS, RequestShape, key_fingerprint
from replayproxy.trace import SUFFIX, TraceHeader, TraceWriter

_log = logging.getLogger("replayproxy.proxy")
_POLL_S = 0.02
_COUNT_LIMIT = 1 << 53  # token counts past this are nonsense from upstream; a float could not add them


class Recorder:
    """Implements observe.Observer; `start` before traffic, `close` after the last exchange ended."""

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
        self._hasher = hasher
        self._links = SessionLinker(hasher.key)  # touched by the recorder thread only
        self._sample = sample
        self._endpoints = settings.endpoints_recorded
        self._rate = settings.sample_rate
        self._queue: deque[Capture] = deque()  # bounded by finished(): queue_records and queue_bytes
        self._max_bytes = settings.queue_bytes
        self._put_bytes = 0
        self._taken_bytes = 0
        self._anchor = Anchor.take()
        self._header = TraceHeader(
            start_wall_ns=self._anchor.wall_ns,
            source="proxy",
            block_size=hasher.block_size,
            block_unit=hasher.unit,
            key_fingerprint=key_fingerprint(hasher.key),
            upstream=_without_credentials(settings.upstream),
            tokenizer=hasher.tokenizer_name,
            recorder=f"replayproxy {__version__}",
        )
        self._writer: TraceWriter | None = None
        self._given = 0  # records handed to the current writer
        self._written = 0  # of those, flushed to disk
        self._bytes = 0
        self._lost = 0  # of those, lost with a file deleted while open
        self._retry_at_ns = 0
        self._files_state: tuple[int, Path | None] = (0, None)
        self._log = RateLimitedLog(settings.log_interval_s)
        self._rotate = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replayproxy-recorder", daemon=True)
        for endpoint in ENDPOINTS:
            metrics.recorded[endpoint] = EndpointFigures()
        metrics.queue_depth.set_function(lambda: len(self._queue))  # read at scrape time
        self.failing = ""  # why records are being dropped (trace writing fails); "" while it works
        metrics.recording_failing.set_function(lambda: 1.0 if self.failing else 0.0)

    @property
    def files(self) -> list[Path]:
        """This recorder's trace files, oldest first (by modification time, then name)."""
        found = self._settings.trace_dir.glob(f"{self._settings.file_prefix}-*{SUFFIX}")  # type: ignore[union-attr]
        return [path for _, path in sorted((_mtime_ns(p), p) for p in found)]

    @property
    def pending(self) -> int:
        """Captures waiting for the thread."""
        return len(self._queue)

    def start(self) -> None:
        self._guard(self._apply_retention)
        self._thread.start()

    # ------------------------------------------------------------------ event loop side

    def wants(self, endpoint: str) -> bool:
        return endpoint in self._endpoints and (self._rate >= 1.0 or self._sample() < self._rate)

    def finished(self, capture: Capture) -> None:
        """Enqueue without waking the thread (it polls): no lock, no syscall on the forwarding path."""
        size = capture.request_bytes + capture.response_bytes
        queued_bytes = self._put_bytes - self._taken_bytes
        if len(self._queue) >= self._settings.queue_records or queued_bytes + size > self._max_bytes:
            self._metrics.records_dropped.labels("queue_full").inc()
            return
        self._put_bytes += size  # written by the event loop only; _taken_bytes by the thread only
        self._queue.append(capture)

    def rotate(self) -> None:
        """Close the current file now (SIGHUP); the next record opens a new one."""
        self._rotate.set()

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, then close the file with its footer."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # ------------------------------------------------------------------ recorder thread

    def _run(self) -> None:
        """Drain the queue in batches every _POLL_S: a thread woken per request would cost the event
        loop a futex call and a context switch each time. It sleeps rather than waiting on an
        Event: a timed Event.wait builds a lock and a waiter list on every poll (~25k instructions,
        50 times a second), and stop or rotate can wait one poll."""
        while True:
            stopping = self._stop.is_set()
            while self._queue:
                self._guard(self._record_queued)
            self._guard(self._idle)
            if stopping:
                break
            time.sleep(_POLL_S)
        self._guard(self._close_writer)

    def _record_queued(self) -> None:
        """Shape what is queued now and hand it to the writer in one call, so the writer's frame and
        clock checks and the metrics export run once per batch, not once per record."""
        shapes: list[RequestShape] = []
        while self._queue:
            capture = self._queue.popleft()
            self._taken_bytes += capture.request_bytes + capture.response_bytes
            shape = self._shape(capture)
            if shape is not None:
                shapes.append(shape)
        if not shapes:
            return
        writer = self._open_writer()
        if writer is None:
            self._metrics.records_dropped.labels("writer_error").inc(len(shapes))
            return
        self._given += len(shapes)
        writer.write_many(shapes)
        self._account(writer)

    def _shape(self, capture: Capture) -> RequestShape | None:
        """The capture's shape, its figures counted; a failure costs this record alone."""
        try:
            shape = build_shape(capture, self._hasher, self._anchor.mono_ns, self._links)
            self._observe(shape)
            return shape
        except Exception as e:  # noqa: BLE001 — a malformed exchange must not stop recording
            self._metrics.records_dropped.labels("shape_error").inc()
            self._log("shape", f"could not build a request shape: {type(e).__name__}")
            return None

    def _idle(self) -> None:
        rotate = self._rotate.is_set()
        if rotate:
            self._rotate.clear()
        if self._writer is None:
            return
        if rotate:
            self._writer.rotate()
            self._apply_retention()
        else:
            self._writer.poll()
        self._account(self._writer)

    def _open_writer(self) -> TraceWriter | None:
        if self._writer is None and now_ns() >= self._retry_at_ns:
            s = self._settings
            self._writer = TraceWriter(
                self._header,
                mono_ns=now_ns,
                wall_ns=wall_ns,
                directory=s.trace_dir,
                prefix=s.file_prefix,
                flush_interval_s=s.flush_interval_s,
                rotate_bytes=s.rotate_bytes or None,
                rotate_seconds=s.rotate_s or None,
                count_unfit=self._count_unfit,
            )
            self._given = self._written = self._bytes = self._lost = 0
            self._files_state = (0, None)
        return self._writer

    def _count_unfit(self, field: str, values: int) -> None:
        self._metrics.values_clamped.labels(field).inc(values)
        self._log("unfit", f"{field}: a value did not fit its trace column; clamped or stored as unknown")

    def _account(self, writer: TraceWriter) -> None:
        """Export what the writer did; a file opened or closed since the last look triggers retention."""
        state = (len(writer.files), writer.current_path)
        if state != self._files_state:
            self._files_state = state
            self._apply_retention()
        if writer.records_lost > self._lost:
            self._metrics.records_lost.labels("file_deleted").inc(writer.records_lost - self._lost)
            _log.error(
                "trace file %s was deleted while open: %d records lost with it; writing on in a new file",
                writer.lost_files[-1].name,
                writer.records_lost - self._lost,
            )
            self._lost = writer.records_lost
        if writer.records_written > self._written:
            self._metrics.records_written.inc(writer.records_written - self._written)
            self._written = writer.records_written
            self.failing = ""
        if writer.bytes_written > self._bytes:
            self._metrics.trace_bytes.inc(writer.bytes_written - self._bytes)
            self._bytes = writer.bytes_written

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._account(self._writer)
            self._writer = None
        self._apply_retention()

    def _guard(self, step: Callable[[], None]) -> None:
        """Run a thread step; on failure drop the writer, count, log, and retry after `retry_s`."""
        try:
            step()
        except Exception as e:  # noqa: BLE001 — fail open: recording failures never reach traffic
            kind = _error_kind(e)
            self._metrics.count_recorder_error(kind)
            detail = f": {e.strerror}" if isinstance(e, OSError) and e.strerror else ""
            self.failing = f"{kind}: {type(e).__name__}{detail}"
            retry = f"retrying in {self._settings.retry_s:g} s"
            self._log(kind, f"trace writing failed ({self.failing}); traffic unaffected, {retry}")
            lost = self._given - self._written
            if lost > 0:
                self._metrics.records_dropped.labels("writer_error").inc(lost)
            if self._writer is not None:
                self._writer.abandon()
            self._writer, self._given, self._written = None, 0, 0
            self._retry_at_ns = now_ns() + int(self._settings.retry_s * 1e9)

    def _apply_retention(self) -> None:
        s = self._settings
        files = self.files
        current = self._writer.current_path if self._writer is not None else None
        if s.retain_files or s.retain_bytes:
            sizes = {f: _size(f) for f in files}
            while len(files) > 1:
                total = sum(sizes[f] for f in files)
                over = (s.retain_files and len(files) > s.retain_files) or (
                    s.retain_bytes and total > s.retain_bytes
                )
                if not over or files[0] == current:
                    break
                files[0].unlink(missing_ok=True)
                files.pop(0)
        self._metrics.trace_files.set(len(files))

    def _observe(self, shape: RequestShape) -> None:
        figures = self._metrics.recorded[shape.endpoint]
        if 0 < shape.input_tokens < _COUNT_LIMIT:
            figures.input_tokens += shape.input_tokens
        if 0 < shape.output_tokens < _COUNT_LIMIT:
            figures.output_tokens += shape.output_tokens
        if shape.error:
            return
        if shape.ttft_ns >= 0:
            figures.ttft.observe(shape.ttft_ns / 1e9)
        if shape.e2e_ns >= 0:
            figures.e2e.observe(shape.e2e_ns / 1e9)
            if shape.ttft_ns >= 0 and shape.output_tokens > 1:
                figures.tpot.observe((shape.e2e_ns - shape.ttft_ns) / (shape.output_tokens - 1) / 1e9)


def _error_kind(e: Exception) -> str:
    if isinstance(e, OSError):
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk_full"
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return "permission"
        return "io"
    return "crash"


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return f"{parts.scheme}://{netloc}{parts.path}"
