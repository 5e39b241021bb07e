"""Trace files (.rpt): the contract between recorders and every consumer.

A file is a sequence of frames. Each frame is a zstd skippable frame holding the next data
frame's compressed length and record count (so a reader can step over a corrupt frame and a
truncated tail is detected exactly), followed by an independent zstd frame whose content is a
msgpack stream of records. Plain `zstd -d` still decodes a whole file. The first record of a file
is the header (a map); request records are positional arrays laid out as the header's `fields`;
the last frame holds a footer map with counts. See docs/trace-format.md.
"""

from __future__ import annotations

import glob
import mmap
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import msgpack
import numpy as np
import zstandard

from replayproxy.shape import FIELD_KINDS, FIELDS, HASH_SCHEME, RequestShape

FORMAT_NAME = "replayproxy-trace"
FORMAT_VERSION = 1  # major: a reader refuses files with a larger one
SUFFIX = ".rpt"

_SKIPPABLE_MAGIC = 0x184D2A5E  # one of zstd's 16 skippable-frame magic numbers
_INDEX = struct.Struct("<IIII")  # magic, payload size (8), compressed length, record count
_INDEX_PAYLOAD = 8


class TraceFormatError(ValueError):
    """The file is not a readable trace (not ours, newer major version, or unreadable header)."""


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """What a consumer must know to interpret the records of one file."""

    start_wall_ns: int  # UTC time of offset 0; files of one recorder share it
    source: str = "proxy"  # proxy | synth | import:<format>
    block_size: int = 16
    block_unit: str = "token"  # token | char
    hash_scheme: str = HASH_SCHEME
    key_fingerprint: str = ""
    upstream: str = ""
    tokenizer: str = ""
    recorder: str = ""
    created_wall_ns: int = 0
    fields: tuple[str, ...] = FIELDS
    extra: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["type"] = "header"
        record["fields"] = list(self.fields)
        record["kinds"] = {name: FIELD_KINDS[name] for name in self.fields}
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TraceHeader:
        known = {k: v for k, v in record.items() if k in cls.__dataclass_fields__}
        known["fields"] = tuple(known.get("fields", FIELDS))
        known["extra"] = dict(known.get("extra") or {})
        return cls(**known)


# --------------------------------------------------------------------------- frame codec


class FrameWriter:
    """Appends index + zstd frames to one open file; shared by trace and result files."""

    def __init__(self, stream: IO[bytes], level: int = 3) -> None:
        self._stream = stream
        self._compressor = zstandard.ZstdCompressor(level=level, write_checksum=True)
        self.bytes_written = 0

    def write_frame(self, payload: bytes, records: int) -> None:
        compressed = self._compressor.compress(payload)
        self._stream.write(_INDEX.pack(_SKIPPABLE_MAGIC, _INDEX_PAYLOAD, len(compressed), records))
        self._stream.write(compressed)
        self._stream.flush()
        self.bytes_written += _INDEX.size + len(compressed)


# Column kinds of a table file: fixed-width numbers are stored as raw little-endian arrays,
# strings and small maps dictionary-coded, ragged fields as one blob plus per-row byte lengths.
NUMERIC_KINDS: dict[str, np.dtype[Any]] = {"i8": np.dtype("<i8"), "u8": np.dtype("<u8"), "b1": np.dtype("?")}
CODED_KINDS = ("str", "obj")
RAGGED_KINDS: dict[str, np.dtype[Any]] = {"ragged:u8": np.dtype("<u8"), "ragged:u4": np.dtype("<u4")}


_packb = msgpack.Packer(use_bin_type=True).pack


def _encode_column(kind: str, values: Sequence[Any] | np.ndarray) -> Any:
    if kind in NUMERIC_KINDS:
        if isinstance(values, np.ndarray):
            return values.astype(NUMERIC_KINDS[kind], copy=False).tobytes()
        return np.fromiter(values, NUMERIC_KINDS[kind], len(values)).tobytes()
    if kind in RAGGED_KINDS:
        return [b"".join(values), np.fromiter(map(len, values), "<u4", len(values)).tobytes()]
    if kind in CODED_KINDS:
        # Maps are keyed by their msgpack bytes: {"n": 1}, {"n": True} and {"n": 1.0} are equal
        # as Python values but must stay distinct.
        keys = list(map(_packb, values)) if kind == "obj" else values
        codes = {key: code for code, key in enumerate(dict.fromkeys(keys))}
        coded = np.fromiter(map(codes.__getitem__, keys), "<u4", len(keys))
        distinct = [msgpack.unpackb(k, strict_map_key=False) for k in codes] if kind == "obj" else list(codes)
        return [distinct, coded.tobytes()]
    raise ValueError(f"unknown column kind {kind!r}")


class TableFile:
    """One open file of header + batches of positional rows + footer (traces and results).

    Rows are buffered and written column-wise, one `batch` record per frame, each column encoded
    by its kind in the header's `kinds` map. Column-wise batches compress better than rows and
    load into numpy without a Python-level loop per record.
    """

    def __init__(self, path: Path, header: dict[str, Any], level: int, exclusive: bool) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._kinds = [header["kinds"][name] for name in header["fields"]]
        self._stream = open(path, "xb" if exclusive else "wb")  # noqa: SIM115 — closed in close()
        self._frames = FrameWriter(self._stream, level)
        self._packer = msgpack.Packer(use_bin_type=True)
        self._rows: list[tuple[Any, ...]] = []
        self.records = 0
        self._frames.write_frame(self._packer.pack(header), 0)

    @property
    def bytes_written(self) -> int:
        return self._frames.bytes_written

    @property
    def pending(self) -> int:
        return len(self._rows)

    def add(self, row: tuple[Any, ...]) -> None:
        self._rows.append(row)

    def flush(self) -> None:
        if not self._rows:
            return
        rows = zip(*self._rows, strict=True)
        columns = [_encode_column(k, c) for k, c in zip(self._kinds, rows, strict=True)]
        batch = {"type": "batch", "n": len(self._rows), "columns": columns}
        self._frames.write_frame(self._packer.pack(batch), len(self._rows))
        self.records += len(self._rows)
        self._rows.clear()

    def write_batch(self, columns: list[Any], n: int) -> None:
        """Append `n` rows already encoded column by column (see write_columns)."""
        self.flush()
        self._frames.write_frame(self._packer.pack({"type": "batch", "n": n, "columns": columns}), n)
        self.records += n

    def write_side_record(self, record: dict[str, Any]) -> None:
        """A map with its own `type` (e.g. telemetry samples), in a frame of its own."""
        self.flush()
        self._frames.write_frame(self._packer.pack(record), 0)

    def close(self, footer: dict[str, Any]) -> None:
        self.flush()
        self._frames.write_frame(self._packer.pack({"type": "footer", "records": self.records, **footer}), 0)
        self._stream.close()


@dataclass(slots=True)
class ReadReport:
    """What a read saw besides records: every skipped byte is accounted for here."""

    files: int = 0
    records: int = 0
    frames: int = 0
    warnings: list[str] = field(default_factory=list)
    skipped_frames: int = 0
    lost_records: int = 0  # records known to be in skipped frames
    footers: int = 0


def iter_frame_payloads(data: bytes | mmap.mmap, name: str, report: ReadReport) -> Iterator[bytes]:
    """Decompressed payloads of every readable frame; damage is reported, never raised mid-file.

    A frame whose index points past the end is a truncated tail (a crash while writing) unless
    another index follows, in which case the index itself was damaged and reading resumes there.
    """
    if not data:
        raise TraceFormatError(f"{name}: empty file, not a replayproxy file")
    if not _MARKER.startswith(data[:8]):
        raise TraceFormatError(f"{name}: not a replayproxy file (bad magic)")
    pos = 0
    view = memoryview(data)
    decompressor = zstandard.ZstdDecompressor()
    while pos < len(data):
        if not _is_index(data, pos):
            nxt = _find_index(data, pos + 1)
            if nxt < 0:
                cut = _MARKER.startswith(data[pos : pos + 8])
                what = "truncated frame index" if cut else "unreadable bytes"
                left = len(data) - pos
                report.warnings.append(f"{name}: {what} at offset {pos} skipped ({left} bytes at the end)")
                return
            report.warnings.append(f"{name}: {nxt - pos} unreadable bytes at offset {pos} skipped")
            pos = nxt
            continue
        _, _, length, records = _INDEX.unpack_from(data, pos)
        start = pos + _INDEX.size
        if start + length > len(data):
            nxt = _find_index(data, start)
            if nxt >= 0:
                report.skipped_frames += 1
                skipped = nxt - pos
                report.warnings.append(f"{name}: damaged frame index at offset {pos}; {skipped} bytes cut")
                pos = nxt
                continue
            report.skipped_frames += 1
            report.lost_records += records
            report.warnings.append(
                f"{name}: truncated last frame at offset {pos} skipped "
                f"({len(data) - pos} of {_INDEX.size + length} bytes present, {records} records lost)"
            )
            return
        try:
            payload = decompressor.decompress(view[start : start + length])
        except zstandard.ZstdError as e:
            report.skipped_frames += 1
            report.lost_records += records
            lost = f"{records} records lost"
            report.warnings.append(f"{name}: corrupt frame at offset {pos} skipped ({lost}): {e}")
        else:
            report.frames += 1
            yield payload
        pos = start + length


_MARKER = struct.pack("<II", _SKIPPABLE_MAGIC, _INDEX_PAYLOAD)


def _is_index(data: bytes | mmap.mmap, pos: int) -> bool:
    return len(data) - pos >= _INDEX.size and data[pos : pos + 8] == _MARKER


def _find_index(data: bytes | mmap.mmap, start: int) -> int:
    """The next index at or after `start` that is complete (a partial one at the end is a tail)."""
    found = data.find(_MARKER, start)
    return found if 0 <= found <= len(data) - _INDEX.size else -1


@dataclass(slots=True)
class Table:
    """One file's header and its columns: numpy arrays by field, ragged ones as (flat, lengths)."""

    path: Path
    header: dict[str, Any]
    n: int = 0
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    ragged: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """Positional rows in the header's field order, ragged fields packed as bytes again."""
        cols: list[list[Any]] = []
        for name in self.header["fields"]:
            if name in self.ragged:
                flat, lengths = self.ragged[name]
                ends = np.cumsum(lengths).tolist()
                blob = flat.astype(flat.dtype.newbyteorder("<")).tobytes()
                size = flat.dtype.itemsize
                cols.append([blob[size * a : size * b] for a, b in zip([0, *ends][:-1], ends, strict=True)])
            else:
                cols.append(self.columns[name].tolist())
        return zip(*cols, strict=True) if self.n else iter(())


def _decode_column(kind: str, parts: list[Any], n: int) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """One field of a whole file from its per-batch parts: a single copy into a native array."""
    if kind in NUMERIC_KINDS:
        return _concat(NUMERIC_KINDS[kind], parts)
    if kind in RAGGED_KINDS:
        dtype = RAGGED_KINDS[kind]
        flat = _concat(dtype, [p[0] for p in parts])
        lengths = _concat(np.dtype("<u4"), [p[1] for p in parts]).astype(np.int64) // dtype.itemsize
        return flat, lengths
    if kind in CODED_KINDS:
        out = np.empty(n, dtype=object)
        at = 0
        for distinct, codes in parts:
            values = np.empty(len(distinct), dtype=object)
            values[:] = list(distinct)
            indices = np.frombuffer(codes, dtype="<u4")
            out[at : at + len(indices)] = values[indices]
            at += len(indices)
        return out
    raise TraceFormatError(f"unknown column kind {kind!r}")


def _concat(dtype: np.dtype[Any], buffers: list[Any]) -> np.ndarray:
    arrays = [np.frombuffer(b, dtype=dtype) for b in buffers]
    joined = np.concatenate(arrays) if arrays else np.empty(0, dtype)
    return joined.astype(dtype.newbyteorder("="), copy=False)


_BUFFERS = (bytes, memoryview)


def _batch_fits(batch: dict[str, Any], kinds: list[str], name: str, report: ReadReport) -> bool:
    """Whether a batch has one column per field, each of `n` rows; a bad one is reported."""
    n, columns = batch.get("n"), batch.get("columns")
    ok = isinstance(n, int) and n >= 0 and isinstance(columns, list) and len(columns) == len(kinds)
    if ok:
        assert isinstance(n, int) and isinstance(columns, list)
        ok = all(_column_fits(kind, column, n) for kind, column in zip(kinds, columns, strict=True))
    if not ok:
        report.warnings.append(f"{name}: malformed batch of {n} records skipped")
        report.skipped_frames += 1
    return ok


def _column_fits(kind: str, column: Any, n: int) -> bool:
    if kind in NUMERIC_KINDS:
        return isinstance(column, _BUFFERS) and len(column) == n * NUMERIC_KINDS[kind].itemsize
    if not (isinstance(column, list) and len(column) == 2 and isinstance(column[1], _BUFFERS)):
        return False
    if len(column[1]) != 4 * n:
        return False
    if kind in RAGGED_KINDS:
        lengths = np.frombuffer(column[1], "<u4")
        return isinstance(column[0], _BUFFERS) and int(lengths.sum()) == len(column[0])
    if kind in CODED_KINDS:
        codes = np.frombuffer(column[1], "<u4")
        return isinstance(column[0], list) and (n == 0 or int(codes.max()) < len(column[0]))
    raise TraceFormatError(f"unknown column kind {kind!r}")


_BIN_HEADER = {0xC4: 2, 0xC5: 3, 0xC6: 5}  # msgpack bin 8/16/32: marker and length bytes
_ARRAY_MARKERS = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])
_MAP_MARKERS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])


def _records_of(payload: bytes, name: str, report: ReadReport) -> list[Any]:
    """The msgpack records of one frame; a frame that does not decode is reported and dropped.

    A batch's column blobs come back as memoryviews into `payload` rather than copies: loading
    then copies each column once, into its final array.
    """
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(payload), 1 << 20))
    unpacker.feed(payload)
    view = memoryview(payload)
    records: list[Any] = []
    try:
        while unpacker.tell() < len(payload):
            if payload[unpacker.tell()] in _MAP_MARKERS:
                records.append(_read_map(unpacker, view))
            else:
                records.append(unpacker.unpack())
    except (ValueError, msgpack.UnpackException, msgpack.OutOfData) as e:
        report.warnings.append(f"{name}: frame {report.frames} does not decode ({e}); skipped")
        report.skipped_frames += 1
        return []
    return records


def _read_map(unpacker: msgpack.Unpacker, view: memoryview) -> dict[Any, Any]:
    record: dict[Any, Any] = {}
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        if key == "columns" and record.get("type") == "batch" and view[unpacker.tell()] in _ARRAY_MARKERS:
            count = unpacker.read_array_header()
            record[key] = [_read_part(unpacker, view, nested=True) for _ in range(count)]
        else:
            record[key] = unpacker.unpack()
    return record


def _read_part(unpacker: msgpack.Unpacker, view: memoryview, nested: bool) -> Any:
    """A bin as a view into the payload, an array of parts one level deep, anything else decoded."""
    at = unpacker.tell()
    marker = view[at]
    if marker in _BIN_HEADER:
        unpacker.skip()
        return view[at + _BIN_HEADER[marker] : unpacker.tell()]
    if nested and marker in _ARRAY_MARKERS:
        return [_read_part(unpacker, view, nested=False) for _ in range(unpacker.read_array_header())]
    return unpacker.unpack()


def _read_bytes(path: Path) -> bytes | mmap.mmap:
    """The file's bytes, memory-mapped when large so a big trace is not copied into the heap first."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 1 << 20:
            return f.read()
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def read_table(
    path: Path,
    format_name: str,
    max_version: int,
    report: ReadReport,
    *,
    extras: dict[str, list[dict[str, Any]]] | None = None,
    footer: dict[str, Any] | None = None,
) -> Table:
    """Read one file of `format_name`; damaged frames are skipped and reported, not raised.

    Side records (maps of another `type`) are appended to `extras` by type; the footer, if
    present, is copied into `footer`.
    """
    name = str(path)
    seen_warnings = len(report.warnings)
    header: dict[str, Any] | None = None
    batches: list[dict[str, Any]] = []
    for payload in iter_frame_payloads(_read_bytes(path), name, report):
        for item in _records_of(payload, name, report):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "batch":
                batches.append(item)
            elif kind == "header" and header is None:
                header = item
            elif kind == "footer":
                report.footers += 1
                if footer is not None:
                    footer.update(item)
            elif isinstance(kind, str) and kind != "header" and extras is not None:
                extras.setdefault(kind, []).append(item)
    if header is None:
        damage = "".join(f" ({w.removeprefix(name + ': ')})" for w in report.warnings[seen_warnings:][:1])
        raise TraceFormatError(f"{name}: no header record; not a readable {format_name} file{damage}")
    if header.get("format") != format_name:
        raise TraceFormatError(f"{name}: is a {header.get('format')!r} file, expected {format_name!r}")
    version = header.get("version")
    if not isinstance(version, int) or version > max_version:
        raise TraceFormatError(
            f"{name}: format version {version} is newer than this reader ({max_version}); upgrade replayproxy"
        )
    try:
        kinds = [header["kinds"][field_name] for field_name in header["fields"]]
    except (KeyError, TypeError) as e:
        raise TraceFormatError(f"{name}: header lacks a kind for field {e}") from e
    batches = [b for b in batches if _batch_fits(b, kinds, name, report)]
    table = Table(path, header, n=sum(int(b["n"]) for b in batches))
    for i, (field_name, kind) in enumerate(zip(header["fields"], kinds, strict=True)):
        decoded = _decode_column(kind, [b["columns"][i] for b in batches], table.n)
        if isinstance(decoded, tuple):
            table.ragged[field_name] = decoded
        else:
            table.columns[field_name] = decoded
    report.files += 1
    report.records += table.n
    return table


def expand_paths(paths: Iterable[str | os.PathLike[str]], suffix: str = SUFFIX) -> list[Path]:
    """Files, directories (their *suffix files) and globs, in name order; missing ones raise."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(sorted(path.glob(f"*{suffix}")))
        elif path.exists():
            found.append(path)
        else:
            matches = sorted(Path(m) for m in glob.glob(str(raw)))
            if not matches:
                raise FileNotFoundError(f"no such file: {raw}")
            found.extend(matches)
    if not found:
        raise FileNotFoundError(f"no {suffix} files in {', '.join(map(str, paths))}")
    return found


# --------------------------------------------------------------------------- writing


class TraceWriter:
    """Writes shapes to rotating trace files; call it from one thread (the recorder's writer thread).

    Frames are cut every `frame_records` records or `flush_interval_s` seconds (checked on every
    `write` and `poll`), so a crash loses at most that much. With `directory`, files are named
    `<prefix>-<UTC timestamp>-<seq>.rpt` and rotate by size and/or age; with `path`, one file,
    created at once.
    Clocks are injected (`mono_ns`, `wall_ns`) because only replayproxy.clock reads clocks.
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
    ) -> None:
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
        self._file: TableFile | None = None
        self._opened_ns = 0
        self._flush_due_ns = mono_ns() + self._flush_interval_ns
        self.files: list[Path] = []
        self.records_written = 0
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
        file = self._file or self._open()
        file.add(shape.to_record())
        if file.pending >= self._frame_records or self._mono() >= self._flush_due_ns:
            self.flush()

    def poll(self) -> None:
        """Cut a frame if the flush interval has passed; the writer thread calls this when idle."""
        if self._file is None:
            return
        if self._file.pending and self._mono() >= self._flush_due_ns:
            self.flush()
        elif self._rotate_due():
            self.rotate()

    def flush(self) -> None:
        self._flush_due_ns = self._mono() + self._flush_interval_ns
        if self._file is None or not self._file.pending:
            return
        pending = self._file.pending
        self._file.flush()
        self.records_written += pending
        if self._rotate_due():
            self.rotate()

    def rotate(self) -> None:
        """Close the current file (footer included); the next record opens a new one."""
        if self._file is None:
            return
        self.records_written += self._file.pending
        self._file.close({"end_wall_ns": self._wall()})
        self.bytes_closed += self._file.bytes_written
        self._file = None

    def close(self) -> None:
        self.rotate()

    def _rotate_due(self) -> bool:
        if self._directory is None or self._file is None:
            return False
        if self._rotate_bytes is not None and self._file.bytes_written >= self._rotate_bytes:
            return True
        return bool(self._rotate_ns and self._mono() - self._opened_ns >= self._rotate_ns)

    def _open(self) -> TableFile:
        header = replace(self.header, created_wall_ns=self._wall()).to_record()
        self._file = TableFile(self._next_path(), header, self._level, self._directory is not None)
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
        for shape in shapes:
            writer.write(shape)
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

    Each scalar field is an array of `n` values or one value for every row; a ragged field is
    `(flat, per-row counts)`; fields left out take RequestShape's defaults. Returns `n`.
    """
    defaults = RequestShape(offset_ns=0)
    record = replace(header, created_wall_ns=wall_ns()).to_record()
    kinds = [record["kinds"][name] for name in record["fields"]]
    table = TableFile(Path(path), record, level, exclusive=False)
    ragged_starts: dict[str, np.ndarray] = {}
    for name, kind in zip(record["fields"], kinds, strict=True):
        if kind in RAGGED_KINDS:
            flat, counts = columns.get(name, (np.zeros(0), np.zeros(n, np.int64)))
            ragged_starts[name] = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    for lo in range(0, n, frame_records):
        hi = min(n, lo + frame_records)
        encoded: list[Any] = []
        for name, kind in zip(record["fields"], kinds, strict=True):
            if kind in RAGGED_KINDS:
                flat = np.asarray(columns[name][0]) if name in columns else np.zeros(0)
                starts = ragged_starts[name]
                part = flat[starts[lo] : starts[hi]].astype(RAGGED_KINDS[kind], copy=False)
                sizes = np.diff(starts[lo : hi + 1]) * RAGGED_KINDS[kind].itemsize
                encoded.append([part.tobytes(), sizes.astype("<u4").tobytes()])
                continue
            value = columns.get(name, getattr(defaults, name))
            if isinstance(value, np.ndarray | list):
                encoded.append(_encode_column(kind, value[lo:hi]))
            elif kind in CODED_KINDS:  # one value for every row: a one-entry dictionary
                encoded.append([[value], np.zeros(hi - lo, "<u4").tobytes()])
            else:
                encoded.append(np.full(hi - lo, value, NUMERIC_KINDS[kind]).tobytes())
        table.write_batch(encoded, hi - lo)
    table.close({"end_wall_ns": wall_ns()})
    return n


# --------------------------------------------------------------------------- reading


def read_tables(
    paths: Iterable[str | os.PathLike[str]], report: ReadReport | None = None
) -> list[tuple[TraceHeader, Table]]:
    """Every trace file's header and rows, oldest start first."""
    report = report if report is not None else ReadReport()
    tables = [read_table(p, FORMAT_NAME, FORMAT_VERSION, report) for p in expand_paths(paths)]
    pairs = [(TraceHeader.from_record(t.header), t) for t in tables]
    pairs.sort(key=lambda pair: pair[0].start_wall_ns)
    return pairs


def iter_shapes(
    paths: Iterable[str | os.PathLike[str]], report: ReadReport | None = None
) -> Iterator[RequestShape]:
    """Shapes of all files in arrival order, offsets rebased to the earliest file's start.

    Recorders write a record when its response ends, so records are sorted here.
    """
    pairs = read_tables(paths, report)
    base = pairs[0][0].start_wall_ns
    shapes: list[RequestShape] = []
    for header, table in pairs:
        shift = header.start_wall_ns - base
        for values in table.rows():
            shape = RequestShape.from_record(values, header.fields)
            shapes.append(replace(shape, offset_ns=shape.offset_ns + shift) if shift else shape)
    shapes.sort(key=lambda s: s.offset_ns)
    return iter(shapes)


# --------------------------------------------------------------------------- numpy columns

RAGGED = ("prefix_hashes", "chunk_gaps_us")


@dataclass(slots=True)
class Columns:
    """A whole trace as numpy arrays, sorted by arrival; ragged fields are flat + index arrays.

    Request i's prefix hashes are `prefix_hashes[prefix_index[i]:prefix_index[i + 1]]`.
    Scalar columns are reached by field name: `columns.input_tokens`, `columns.model`, ...
    """

    headers: list[TraceHeader]
    report: ReadReport
    scalar: dict[str, np.ndarray]
    prefix_hashes: np.ndarray
    prefix_index: np.ndarray
    chunk_gaps_us: np.ndarray
    chunk_index: np.ndarray

    def __len__(self) -> int:
        return len(self.scalar["offset_ns"])

    def __getattr__(self, name: str) -> np.ndarray:
        scalar = object.__getattribute__(self, "scalar")
        if name in scalar:
            return scalar[name]  # type: ignore[no-any-return]
        raise AttributeError(name)

    def hashes_of(self, i: int) -> np.ndarray:
        return self.prefix_hashes[self.prefix_index[i] : self.prefix_index[i + 1]]

    @property
    def message_count(self) -> np.ndarray:
        return np.fromiter((len(r) for r in self.scalar["roles"]), dtype=np.int64, count=len(self))


def load(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> Columns:
    """Load traces into columns: the fast path for inspect, export and replay planning."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    report = ReadReport()
    pairs = read_tables(paths, report)
    base = pairs[0][0].start_wall_ns
    tables = [_with_defaults(table) for _, table in pairs]
    for (header, _), table in zip(pairs, tables, strict=True):
        table.columns["offset_ns"] = table.columns["offset_ns"] + (header.start_wall_ns - base)
    scalar = {name: _joined([t.columns[name] for t in tables]) for name in FIELDS if name not in RAGGED}
    order = np.argsort(scalar["offset_ns"], kind="stable")
    if not _is_identity(order):
        scalar = {name: column[order] for name, column in scalar.items()}
    ragged = {
        name: _reorder_ragged(
            _joined([t.ragged[name][0] for t in tables]),
            _joined([t.ragged[name][1] for t in tables]),
            order,
        )
        for name in RAGGED
    }
    return Columns(
        headers=[header for header, _ in pairs],
        report=report,
        scalar=scalar,
        prefix_hashes=ragged["prefix_hashes"][0],
        prefix_index=ragged["prefix_hashes"][1],
        chunk_gaps_us=ragged["chunk_gaps_us"][0],
        chunk_index=ragged["chunk_gaps_us"][1],
    )


def _with_defaults(table: Table) -> Table:
    """Fill fields an older file lacks with the shape's defaults, so all tables share columns."""
    defaults = RequestShape(offset_ns=0)
    for name, kind in FIELD_KINDS.items():
        if name in table.columns or name in table.ragged:
            continue
        if kind in RAGGED_KINDS:
            table.ragged[name] = (np.zeros(0, RAGGED_KINDS[kind]), np.zeros(table.n, np.int64))
        elif kind in NUMERIC_KINDS:
            table.columns[name] = np.full(table.n, getattr(defaults, name), NUMERIC_KINDS[kind])
        else:
            column = np.empty(table.n, dtype=object)
            column.fill(getattr(defaults, name))
            table.columns[name] = column
    return table


def _reorder_ragged(
    flat: np.ndarray, lengths: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Permute rows of a flat ragged array given per-row lengths; returns flat and its index."""
    starts = np.concatenate([[0], np.cumsum(lengths)])[:-1].astype(np.int64)
    new_lengths = lengths[order]
    index = np.concatenate([[0], np.cumsum(new_lengths)]).astype(np.int64)
    if _is_identity(order):
        return flat, index
    within = np.arange(index[-1]) - np.repeat(index[:-1], new_lengths)
    positions = within + np.repeat(starts[order], new_lengths)
    return flat[positions], index


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _is_identity(order: np.ndarray) -> bool:
    return bool(np.array_equal(order, np.arange(len(order))))
