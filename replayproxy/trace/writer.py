"""Writing traces: the recorder's rotating writer, and whole-trace writers for synth and import."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from replayproxy.shape import FIELD_KINDS, FIELDS, RequestShape, pack_u32, pack_u64
from replayproxy.trace.column_file import (
    CODED_KINDS,
    NUMERIC_KINDS,
    RAGGED_KINDS,
    ColumnFileWriter,
    encode_column,
)
from replayproxy.trace.fit import UNFIT, fit_coded, fit_numbers, fit_ragged
from replayproxy.trace.header import SUFFIX, TraceHeader

WRITE_SLICE = 512  # shapes buffered before they are taken apart into columns
_PACKED = attrgetter("packed")


class TraceWriter:
    """Writes shapes to rotating trace files; call it from one thread (the recorder's writer thread).

    Frames are cut every `frame_records` records or `flush_interval_s` seconds (checked on every
    `write` and `poll`), so a crash loses at most that much. With `directory`, files are named
    `<prefix>-<UTC timestamp>-<seq>.rpt` and rotate by size and/or age; with `path`, one file,
    created at once.
    Clocks are injected (`mono_ns`, `wall_ns`) because only replayproxy.clock reads clocks.
    Shapes are buffered as they are and encoded a column at a time when a frame is cut (no
    per-record row tuple: see benchmarks/trace_io.py).
    """

    def __init__(
        self,
        header: TraceHeader,
        *,
        mono_ns: Callable[[], int],
        wall_ns: Callable[[], int],
        path: str | os.PathLike[str] | None = None,
        directory: str | os.PathLike[str] | None = None,
        prefix: str = "trace",
        flush_interval_s: float = 1.0,
        frame_records: int = 16_384,
        rotate_bytes: int | None = None,
        rotate_seconds: float | None = None,
        level: int = 3,
        count_unfit: Callable[[str, int], None] | None = None,
    ) -> None:
        """`count_unfit(field, n)` hears of values that did not fit their column and were clamped
        or marked unknown (see fit.py)."""
        if (path is None) == (directory is None):
            raise ValueError("give exactly one of path or directory")
        self.header = header
        self._mono = mono_ns
        self._wall = wall_ns
        self._path = Path(path) if path is not None else None
        self._directory = Path(directory) if directory is not None else None
        self._prefix = prefix
        self._flush_interval_ns = int(flush_interval_s * 1e9)
        self._frame_records = frame_records
        self._rotate_bytes = rotate_bytes
        self._rotate_ns = int(rotate_seconds * 1e9) if rotate_seconds else None
        self._level = level
        self._seq = 0
        self._file: ColumnFileWriter | None = None
        self._shapes: list[RequestShape] = []  # at most WRITE_SLICE, then moved into _columns
        self._columns = _FrameColumns(header.fields, count_unfit or _ignore_unfit)
        self._opened_ns = 0
        self._flush_due_ns = mono_ns() + self._flush_interval_ns
        self.files: list[Path] = []
        self.records_written = 0
        self.records_lost = 0  # written to a file that was deleted while open (see flush)
        self.lost_files: list[Path] = []
        self.bytes_closed = 0  # bytes of files already closed
        if self._path is not None:
            self._open()  # a single-file trace exists (header and footer) even with no records

    @property
    def current_path(self) -> Path | None:
        return self._file.path if self._file is not None else None

    @property
    def bytes_written(self) -> int:
        return self.bytes_closed + (self._file.bytes_written if self._file else 0)

    def write(self, shape: RequestShape) -> None:
        self.write_many((shape,))

    def write_many(self, shapes: Sequence[RequestShape]) -> None:
        """Append shapes in order; a recorder draining its queue, or a whole trace, passes many at
        once so the frame and clock checks run per slice rather than per shape."""
        at = 0
        while at < len(shapes):
            if self._file is None:  # the first write, or the last flush rotated
                self._open()
            room = min(WRITE_SLICE - len(self._shapes), self._frame_records - self._pending())
            self._shapes.extend(shapes[at : at + room])
            at += room
            if len(self._shapes) >= WRITE_SLICE:
                self._columns.add(self._shapes)
                self._shapes.clear()
            if self._pending() >= self._frame_records or self._mono() >= self._flush_due_ns:
                self.flush()

    def poll(self) -> None:
        """Cut a frame if the flush interval has passed; the writer thread calls this when idle."""
        if self._file is None:
            return
        if self._mono() >= self._flush_due_ns:
            self.flush()
        if self._rotate_due():
            self.rotate()

    def flush(self) -> None:
        """Cut a frame of what is buffered. Once per call (a flush interval at most, not per
        record) the open file is checked to still exist: records written into a deleted file are
        counted in `records_lost` and writing goes on in a new file (the directory re-created)."""
        self._flush_due_ns = self._mono() + self._flush_interval_ns
        if self._file is None:
            return
        if self._file.unlinked():
            self.records_lost += self._file.records
            self.lost_files.append(self._file.path)
            self._file.abandon()
            self._open()  # at once, so the directory is back for whoever looks
        if not self._pending():
            return
        assert self._file is not None
        self._cut(self._file)
        if self._rotate_due():
            self.rotate()

    def rotate(self) -> None:
        """Close the current file (footer included); the next record opens a new one."""
        if self._file is None:
            return
        if self._pending():
            self._cut(self._file)
        self._file.close({"end_wall_ns": self._wall()})
        self.bytes_closed += self._file.bytes_written
        self._file = None

    def close(self) -> None:
        self.rotate()

    def abandon(self) -> None:
        """Drop the current file after a write failure (full disk, I/O error) without touching it
        again; buffered records are lost and the next write opens a new file."""
        self._shapes.clear()
        self._columns.clear()
        if self._file is not None:
            self._file.abandon()
            self._file = None

    def _pending(self) -> int:
        return self._columns.n + len(self._shapes)

    def _cut(self, file: ColumnFileWriter) -> None:
        """Write the buffered shapes as one frame."""
        self._columns.add(self._shapes)
        self._shapes.clear()
        n = self._columns.n
        file.write_batch(self._columns.encode(), n)
        self.records_written += n

    def _rotate_due(self) -> bool:
        if self._directory is None or self._file is None:
            return False
        if self._rotate_bytes is not None and self._file.bytes_written >= self._rotate_bytes:
            return True
        return bool(self._rotate_ns and self._mono() - self._opened_ns >= self._rotate_ns)

    def _open(self) -> ColumnFileWriter:
        header = replace(self.header, created_wall_ns=self._wall()).to_record()
        self._file = ColumnFileWriter(self._next_path(), header, self._level, self._directory is not None)
        self.files.append(self._file.path)
        self._opened_ns = self._mono()
        return self._file

    def _next_path(self) -> Path:
        if self._path is not None:
            return self._path
        assert self._directory is not None
        stamp = datetime.fromtimestamp(self._wall() / 1e9, UTC).strftime("%Y%m%dT%H%M%S")
        while True:
            self._seq += 1
            path = self._directory / f"{self._prefix}-{stamp}Z-{self._seq:04d}{SUFFIX}"
            if not path.exists():
                return path

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _FrameColumns:
    """A frame's columns gathered from shapes a slice at a time, each encoded by its FIELD_KINDS kind.

    Shapes are released a slice at a time, while still in cache, rather than a frame at a time.
    Each column is encoded whole; only when that fails are its values fitted one by one (fit.py),
    so one value no column can hold costs that value, counted through `count_unfit`, never the
    frame.
    """

    def __init__(self, fields: Sequence[str], count_unfit: Callable[[str, int], None]) -> None:
        self._columns: list[tuple[str, str, int, list[Any]]] = [
            (name, FIELD_KINDS[name], FIELDS.index(name), []) for name in fields
        ]
        self._count_unfit = count_unfit
        self.n = 0

    def add(self, shapes: Sequence[RequestShape]) -> None:
        if not shapes:
            return
        by_field = list(zip(*shapes, strict=True))
        for name, kind, position, pieces in self._columns:
            values = by_field[position]
            if kind in NUMERIC_KINDS:
                pieces.append(self._numbers(name, kind, values))
            elif kind == "ragged:u8":
                try:
                    packed = list(map(_PACKED, values))  # BlockHashes, as the recorder and synth make them
                except AttributeError:
                    packed = self._ragged(name, kind, values, pack_u64)
                pieces.extend(packed)
            elif kind == "ragged:u4":
                pieces.extend(
                    self._ragged(name, kind, values, pack_u32) if any(values) else [b""] * len(values)
                )
            else:
                pieces.extend(values)
        self.n += len(shapes)

    def _numbers(self, name: str, kind: str, values: Sequence[Any]) -> np.ndarray:
        dtype = NUMERIC_KINDS[kind]
        try:
            return np.fromiter(values, dtype, len(values))
        except UNFIT:
            fitted, changed = fit_numbers(kind, values, _DEFAULTS[name])
            self._count_unfit(name, changed)
            return np.fromiter(fitted, dtype, len(fitted))

    def _ragged(
        self, name: str, kind: str, values: Sequence[Any], pack: Callable[[Sequence[int]], bytes]
    ) -> list[bytes]:
        try:
            return list(map(pack, values))
        except UNFIT:
            packed = []
            for value in values:
                try:
                    packed.append(pack(value))
                except UNFIT:
                    fitted = fit_ragged(kind, value)
                    packed.append(pack(fitted) if fitted is not None else b"")
                    self._count_unfit(name, 1)
            return packed

    def encode(self) -> list[Any]:
        """The frame's encoded columns; the buffer starts empty again."""
        encoded = [
            np.concatenate(pieces) if kind in NUMERIC_KINDS else self._coded(name, kind, pieces)
            for name, kind, _, pieces in self._columns
        ]
        self.clear()
        return encoded

    def _coded(self, name: str, kind: str, pieces: list[Any]) -> Any:
        """A dictionary-coded or ragged column. The distinct strings are checked once per frame
        (usually one or a few): they are packed only later, with the whole frame; maps were packed
        already, to be told apart."""
        try:
            column = encode_column(kind, pieces)
            if kind == "str" and not all(isinstance(v, str) for v in column[0]):
                raise TypeError("a string column holds other values")
            if kind == "str":
                _packb(column[0])
            return column
        except UNFIT:
            fitted, changed = fit_coded(kind, pieces, _DEFAULTS[name])
            self._count_unfit(name, changed)
            return encode_column(kind, fitted)

    def clear(self) -> None:
        for _, _, _, pieces in self._columns:
            pieces.clear()
        self.n = 0


_DEFAULTS: dict[str, Any] = RequestShape(offset_ns=0)._asdict()
_packb = msgpack.Packer(use_bin_type=True).pack


def _ignore_unfit(name: str, count: int) -> None:
    """Writers of whole traces (synth, import) produce fitting values; nothing to count there."""


def write_trace(
    path: str | os.PathLike[str],
    header: TraceHeader,
    shapes: Iterable[RequestShape],
    *,
    mono_ns: Callable[[], int],
    wall_ns: Callable[[], int],
) -> int:
    """Write a whole trace to one file (synth, import); returns the record count."""
    with TraceWriter(header, path=path, mono_ns=mono_ns, wall_ns=wall_ns, flush_interval_s=1e9) as writer:
        iterator = iter(shapes)
        while chunk := list(itertools.islice(iterator, WRITE_SLICE)):
            writer.write_many(chunk)
    return writer.records_written


def write_columns(
    path: str | os.PathLike[str],
    header: TraceHeader,
    columns: dict[str, Any],
    n: int,
    *,
    wall_ns: Callable[[], int],
    frame_records: int = 65536,
    level: int = 3,
) -> int:
    """Write a whole trace from columns, with no object per request (importers of million-row files).

    Each scalar field is an array of `n` values, one value for every row, or a function giving the
    values of rows [lo, hi); a ragged field is `(flat, per-row counts)`, where `flat` may also be a
    function giving the flat values of rows [lo, hi) and the counts a function giving those rows'
    counts (so that neither need be in memory whole: rows are asked for a frame at a time, in
    order). Fields left out take RequestShape's defaults. Returns `n`.
    """
    defaults = RequestShape(offset_ns=0)
    record = replace(header, created_wall_ns=wall_ns()).to_record()
    kinds = [record["kinds"][name] for name in record["fields"]]
    table = ColumnFileWriter(Path(path), record, level, exclusive=False)
    flat_at = dict.fromkeys(record["fields"], 0)  # where each ragged field's next frame starts in `flat`
    for lo in range(0, n, frame_records):
        hi = min(n, lo + frame_records)
        encoded: list[Any] = []
        for name, kind in zip(record["fields"], kinds, strict=True):
            if kind in RAGGED_KINDS:
                flat, counts = columns.get(name, (np.zeros(0), None))
                frame_counts = _rows_of(counts, lo, hi) if counts is not None else np.zeros(hi - lo, np.int64)
                start, stop = flat_at[name], flat_at[name] + int(np.sum(frame_counts, dtype=np.int64))
                flat_at[name] = stop
                values = flat(lo, hi) if callable(flat) else np.asarray(flat)[start:stop]
                part = values.astype(RAGGED_KINDS[kind], copy=False)
                sizes = np.asarray(frame_counts, np.int64) * RAGGED_KINDS[kind].itemsize
                encoded.append([part, sizes.astype("<u4")])
                continue
            value = columns.get(name, getattr(defaults, name))
            if callable(value) or isinstance(value, np.ndarray | list):
                encoded.append(encode_column(kind, _rows_of(value, lo, hi)))
            elif kind in CODED_KINDS:  # one value for every row: a one-entry dictionary
                encoded.append([[value], np.zeros(hi - lo, "<u4")])
            else:
                encoded.append(np.full(hi - lo, value, NUMERIC_KINDS[kind]))
        table.write_batch(encoded, hi - lo)
    table.close({"end_wall_ns": wall_ns()})
    return n


def _rows_of(values: Any, lo: int, hi: int) -> Any:
    """Rows [lo, hi) of a column given as a sequence or as a function of the range."""
    return values(lo, hi) if callable(values) else values[lo:hi]
