"""Recording's work: captures in, request shapes built and written to rotating trace files.

Runs in the recorder process (child.py), single-threaded and free of the forwarding path's
GIL. It builds shapes (JSON, SSE, hashing), writes them through `TraceWriter`, applies retention,
and survives any failure: a full disk, an unwritable directory or a bug drops records (counted,
logged once per interval) and writing resumes by itself after `retry_s`. What it counts goes into
a `Tally` that the proxy process adds to its metrics.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from replayproxy import __version__
from replayproxy.clock import Anchor, now_ns, wall_ns
from replayproxy.proxy.extract import build_shape
from replayproxy.proxy.linker import SessionLinker
from replayproxy.proxy.observe import Capture, RateLimitedLog
from replayproxy.proxy.prompt import PromptHasher
from replayproxy.proxy.recording.tally import Tally
from replayproxy.proxy.recording.upload import SegmentUploader, pod_name
from replayproxy.proxy.settings import ProxySettings
from replayproxy.shape import RequestShape, key_fingerprint
from replayproxy.trace import SUFFIX, TraceHeader, TraceWriter

_log = logging.getLogger("replayproxy.proxy")
_COUNT_LIMIT = 1 << 53  # token counts past this are nonsense from upstream; a float could not add them


def trace_header(settings: ProxySettings, hasher: PromptHasher, anchor: Anchor) -> TraceHeader:
    """The header of every file of one proxy run (a restarted recorder process writes the same)."""
    return TraceHeader(
        start_wall_ns=anchor.wall_ns,
        source="proxy",
        block_size=hasher.block_size,
        block_unit=hasher.unit,
        key_fingerprint=key_fingerprint(hasher.key),
        upstream=_without_credentials(settings.upstream),
        tokenizer=hasher.tokenizer_name,
        recorder=f"replayproxy {__version__}",
    )


def trace_files(settings: ProxySettings) -> list[Path]:
    """The trace files of this proxy's prefix, oldest first (by modification time, then name)."""
    assert settings.trace_dir is not None
    found = settings.trace_dir.glob(f"{settings.file_prefix}-*{SUFFIX}")
    return [path for _, path in sorted((_mtime_ns(p), p) for p in found)]


class TraceRecorder:
    """`start`, then `record` batches and `idle` between them; `close` writes the footer."""

    def __init__(self, settings: ProxySettings, hasher: PromptHasher, anchor: Anchor, tally: Tally) -> None:
        assert settings.trace_dir is not None
        self._settings = settings
        self._hasher = hasher
        self._links = SessionLinker(hasher.key)
        self._origin_ns = anchor.mono_ns
        self._header = trace_header(settings, hasher, anchor)
        self.tally = tally
        self._writer: TraceWriter | None = None
        self._given = 0  # records handed to the current writer
        self._written = 0  # of those, flushed to disk
        self._bytes = 0
        self._lost = 0  # of those, lost with a file deleted while open
        self._retry_at_ns = 0
        self._files_state: tuple[int, Path | None] = (0, None)
        self._log = RateLimitedLog(settings.log_interval_s)
        self._uploader = (
            SegmentUploader(settings.upload_url, pod_name(settings.pod_name), settings.upload_retry_s)
            if settings.upload_url
            else None
        )

    def start(self) -> None:
        if self._uploader is not None:
            self._uploader.start()
        self._guard(self._apply_retention)

    def record(self, captures: Sequence[Capture]) -> None:
        """Shape a batch and hand it to the writer in one call, so the writer's frame and clock
        checks and the accounting run once per batch, not once per record."""
        self._guard(lambda: self._record(captures))

    def idle(self, rotate: bool = False) -> None:
        """Between batches: cut a frame when the flush interval is up, or rotate now (SIGHUP)."""
        self._guard(lambda: self._idle(rotate))
        self._count_uploads()

    def close(self) -> None:
        self._guard(self._close_writer)
        if self._uploader is not None:
            self._uploader.close(self._settings.upload_drain_s)
            self._count_uploads()
            if self._uploader.waiting:
                left = self._uploader.waiting
                _log.warning("%d trace files not uploaded yet; the next start uploads them", left)

    def _count_uploads(self) -> None:
        """The upload thread's counts since the last look, into this report (this thread owns it)."""
        if self._uploader is None:
            return
        uploaded, failed, lost, kinds = self._uploader.take_counts()
        tally = self.tally
        if uploaded:
            tally.count(tally.uploads, "uploaded", uploaded)
        if failed:
            tally.count(tally.uploads, "failed", failed)
            self._log("upload", f"uploading trace files failed ({kinds[-1]}); kept locally and retried")
        if lost:
            tally.count(tally.uploads, "lost", lost)

    def _record(self, captures: Sequence[Capture]) -> None:
        shapes: list[RequestShape] = []
        for capture in captures:
            shape = self._shape(capture)
            if shape is not None:
                shapes.append(shape)
        if not shapes:
            return
        writer = self._open_writer()
        if writer is None:
            self.tally.count(self.tally.dropped, "writer_error", len(shapes))
            return
        self._given += len(shapes)
        writer.write_many(shapes)
        self._account(writer)

    def _shape(self, capture: Capture) -> RequestShape | None:
        """The capture's shape, its figures counted; a failure costs this record alone."""
        try:
            shape = build_shape(capture, self._hasher, self._origin_ns, self._links)
            self._observe(shape)
            return shape
        except Exception as e:  # noqa: BLE001 — a malformed exchange must not stop recording
            self.tally.count(self.tally.dropped, "shape_error")
            self._log("shape", f"could not build a request shape: {type(e).__name__}")
            return None

    def _idle(self, rotate: bool) -> None:
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
        self.tally.count(self.tally.clamped, field, values)
        self._log("unfit", f"{field}: a value did not fit its trace column; clamped or stored as unknown")

    def _account(self, writer: TraceWriter) -> None:
        """Count what the writer did; a file opened or closed since the last look triggers retention."""
        tally = self.tally
        state = (len(writer.files), writer.current_path)
        if state != self._files_state:
            self._files_state = state
            self._apply_retention()
        if writer.records_lost > self._lost:
            tally.count(tally.lost, "file_deleted", writer.records_lost - self._lost)
            _log.error(
                "trace file %s was deleted while open: %d records lost with it; writing on in a new file",
                writer.lost_files[-1].name,
                writer.records_lost - self._lost,
            )
            self._lost = writer.records_lost
        if writer.records_written > self._written:
            tally.written += writer.records_written - self._written
            self._written = writer.records_written
            tally.failing = ""
        if writer.bytes_written > self._bytes:
            tally.trace_bytes += writer.bytes_written - self._bytes
            self._bytes = writer.bytes_written

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._account(self._writer)
            self._writer = None
        self._apply_retention()

    def _guard(self, step: Callable[[], None]) -> None:
        """Run a step; on failure drop the writer, count, log, and retry after `retry_s`."""
        try:
            step()
        except Exception as e:  # noqa: BLE001 — fail open: recording failures never reach traffic
            kind = _error_kind(e)
            tally = self.tally
            tally.count(tally.errors, kind)
            detail = f": {e.strerror}" if isinstance(e, OSError) and e.strerror else ""
            tally.failing = f"{kind}: {type(e).__name__}{detail}"
            retry = f"retrying in {self._settings.retry_s:g} s"
            self._log(kind, f"trace writing failed ({tally.failing}); traffic unaffected, {retry}")
            lost = self._given - self._written
            if lost > 0:
                tally.count(tally.dropped, "writer_error", lost)
            if self._writer is not None:
                self._writer.abandon()
            self._writer, self._given, self._written = None, 0, 0
            self._retry_at_ns = now_ns() + int(self._settings.retry_s * 1e9)

    def _apply_retention(self) -> None:
        s = self._settings
        files = trace_files(s)
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
        self.tally.trace_files = len(files)
        if self._uploader is not None:
            self._uploader.offer(f for f in files if f != current)

    def _observe(self, shape: RequestShape) -> None:
        figures = self.tally.endpoint(shape.endpoint)
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
