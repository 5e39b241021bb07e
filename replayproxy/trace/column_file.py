"""Column files, the container of traces and results: a header map, column-wise row batches, a footer.

Columns are encoded by kind — fixed-width numbers as raw little-endian arrays, strings and small
maps dictionary-coded, ragged fields as one blob plus per-row byte lengths — so a file loads
into numpy without a Python-level loop per record.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import numpy as np

from replayproxy.errors import FileAccessError, user_file
from replayproxy.trace import storage
from replayproxy.trace.frames import FrameWriter, Part, ReadReport, frame_totals, iter_frame_payloads
from replayproxy.trace.header import SUFFIX, TraceFormatError
from replayproxy.trace.mapped import SpilledArray
from replayproxy.trace.storage import Source

# Column kinds: fixed-width numbers as raw little-endian arrays, strings and small maps
# dictionary-coded, ragged fields as one blob plus per-row byte lengths.
NUMERIC_KINDS: dict[str, np.dtype[Any]] = {"i8": np.dtype("<i8"), "u8": np.dtype("<u8"), "b1": np.dtype("?")}
CODED_KINDS = ("str", "obj")
RAGGED_KINDS: dict[str, np.dtype[Any]] = {"ragged:u8": np.dtype("<u8"), "ragged:u4": np.dtype("<u4")}


_packb = msgpack.Packer(use_bin_type=True).pack


@dataclass(frozen=True, slots=True)
class Pieces:
    """A blob given as its pieces in order (a ragged column's rows), written without being joined."""

    items: list[bytes]
    nbytes: int


def encode_column(kind: str, values: Sequence[Any] | np.ndarray) -> Any:
    if kind in NUMERIC_KINDS:
        if isinstance(values, np.ndarray):
            return values.astype(NUMERIC_KINDS[kind], copy=False)
        return np.fromiter(values, NUMERIC_KINDS[kind], len(values))
    if kind in RAGGED_KINDS:
        sizes = np.fromiter(map(len, values), "<u4", len(values))
        return [Pieces(list(values), int(sizes.sum(dtype=np.int64))), sizes]
    if kind in CODED_KINDS:
        if _all_alike(kind, values):  # the common case: one model, one endpoint, no sampling
            return [[values[0]], np.zeros(len(values), "<u4")]
        # Maps are keyed by their msgpack bytes: {"n": 1}, {"n": True} and {"n": 1.0} are equal
        # as Python values but must stay distinct.
        keys = list(map(_packb, values)) if kind == "obj" else values
        codes = {key: code for code, key in enumerate(dict.fromkeys(keys))}
        coded = np.fromiter(map(codes.__getitem__, keys), "<u4", len(keys))
        distinct = [msgpack.unpackb(k, strict_map_key=False) for k in codes] if kind == "obj" else list(codes)
        return [distinct, coded]
    raise ValueError(f"unknown column kind {kind!r}")


def _all_alike(kind: str, values: Sequence[Any] | np.ndarray) -> bool:
    """Whether every value is the first one: equal strings, or all maps empty (equal non-empty
    maps may still differ in their msgpack bytes, see above)."""
    if not len(values):
        return False
    if kind == "obj":
        return not any(values)
    listed = values if isinstance(values, list) else list(values)
    return listed.count(values[0]) == len(values)


# A batch is the map {"type": "batch", "n": n, "columns": [...]}, packed here in parts so that big
# column blobs go to zstd as they are instead of being copied into one msgpack payload first.
_BATCH_HEAD = msgpack.Packer().pack_map_header(3) + b"".join(map(msgpack.packb, ("type", "batch", "n")))
_COLUMNS_KEY = msgpack.packb("columns")


def _pack_parts(value: Any, packer: msgpack.Packer, parts: list[Part]) -> None:
    """Append `value` packed as msgpack to `parts`; arrays and pieces go as they are, uncopied."""
    if isinstance(value, Pieces):
        parts.append(_bin_header(value.nbytes))
        parts.extend(value.items)
    elif isinstance(value, np.ndarray):
        parts.append(_bin_header(value.nbytes))
        parts.append(value.data.cast("B"))
    elif isinstance(value, list):
        parts.append(packer.pack_array_header(len(value)))
        for item in value:
            _pack_parts(item, packer, parts)
    else:
        parts.append(packer.pack(value))


def _bin_header(size: int) -> bytes:
    """msgpack's bin header in its shortest form, as msgpack itself writes it."""
    if size < 1 << 8:
        return bytes((0xC4, size))
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


class ColumnFileWriter:
    """One open file of header + batches of positional rows + footer (traces and results).

    Rows are buffered and written column-wise, one `batch` record per frame, each column encoded
    by its kind in the header's `kinds` map. Column-wise batches compress better than rows and
    load into numpy without a Python-level loop per record.
    """

    def __init__(self, path: Path, header: dict[str, Any], level: int, exclusive: bool) -> None:
        self.path = path
        self._kinds = [header["kinds"][name] for name in header["fields"]]
        with user_file(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            self._stream = open(path, "xb" if exclusive else "wb")  # noqa: SIM115 — closed in close()
        self._frames = FrameWriter(self._stream, level)
        self._packer = msgpack.Packer(use_bin_type=True)
        self._rows: list[tuple[Any, ...]] = []
        self.records = 0
        try:
            self._frames.write_frame([self._packer.pack(header)], 0)
        except BaseException:
            self.abandon()  # a full disk must not leave an empty file for every retry
            raise

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
        columns = [encode_column(k, c) for k, c in zip(self._kinds, rows, strict=True)]
        n = len(self._rows)
        self._rows.clear()
        self.write_batch(columns, n)

    def write_batch(self, columns: list[Any], n: int) -> None:
        """Append `n` rows already encoded column by column (see write_columns); a column's blobs
        may be numpy arrays, handed to zstd without a copy."""
        self.flush()
        parts: list[Part] = [_BATCH_HEAD, self._packer.pack(n), _COLUMNS_KEY]
        _pack_parts(columns, self._packer, parts)
        self._frames.write_frame(parts, n)
        self.records += n

    def write_side_record(self, record: dict[str, Any]) -> None:
        """A map with its own `type` (e.g. telemetry samples), in a frame of its own."""
        self.flush()
        self._frames.write_frame([self._packer.pack(record)], 0)

    def close(self, footer: dict[str, Any]) -> None:
        self.flush()
        record = {"type": "footer", "records": self.records, **footer}
        self._frames.write_frame([self._packer.pack(record)], 0)
        self._stream.close()

    def unlinked(self) -> bool:
        """Whether the open file was deleted (its directory removed, say): writes would vanish."""
        return os.fstat(self._stream.fileno()).st_nlink == 0

    def abandon(self) -> None:
        """Release the file after a write failed, writing nothing more: it ends early, and readers
        report the missing footer; every complete frame before the failure stays readable. A file
        that holds no record yet (empty, or its header alone) is removed."""
        with contextlib.suppress(OSError):
            self._stream.close()
        if not self.records:
            with contextlib.suppress(OSError):
                self.path.unlink()


@dataclass(slots=True)
class ColumnFileData:
    """One file's header and its columns: numpy arrays by field, ragged ones as (flat, lengths)."""

    path: Source
    header: dict[str, Any]
    n: int = 0
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    ragged: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


class _Growing:
    """An array filled in order and grown rarely: sized up front from the frame indexes, or
    from projections (see _ColumnsBeingRead._projected)."""

    def __init__(self, dtype: np.dtype[Any], capacity: int) -> None:
        self._array = np.empty(max(capacity, 16), dtype)
        self.size = 0

    @property
    def capacity(self) -> int:
        return len(self._array)

    def extend(self, values: np.ndarray) -> None:
        end = self.size + len(values)
        if end > len(self._array):
            self.reserve(max(end, 2 * len(self._array)))
        self._array[self.size : end] = values
        self.size = end

    def reserve(self, capacity: int) -> None:
        if capacity > len(self._array):
            grown = np.empty(capacity, self._array.dtype)
            grown[: self.size] = self._array[: self.size]
            self._array = grown

    def result(self) -> np.ndarray:
        """The filled part; the unused tail (never touched, so never resident) is released."""
        self._array.resize(self.size, refcheck=False)
        return self._array


class _ColumnsBeingRead:
    """A file's columns, filled frame by frame: each batch is copied straight into its final array.

    A frame's payload is overwritten by the next one (see iter_frame_payloads), so nothing here
    keeps a view of it.
    """

    def __init__(
        self, kinds: list[str], records: int, payload_bytes: int, kept: list[bool], spilled: list[bool]
    ) -> None:
        self.kinds = kinds
        self.kept = kept  # columns not kept are checked but never decoded
        self._payload_bytes = payload_bytes
        self._payload_seen = 0
        self._columns: list[tuple[_Growing | SpilledArray, ...]] = []
        for kind, keep, spill in zip(kinds, kept, spilled, strict=True):
            if not keep:
                self._columns.append(())
            elif kind in NUMERIC_KINDS:
                dtype = NUMERIC_KINDS[kind].newbyteorder("=")
                self._columns.append((SpilledArray(dtype) if spill else _Growing(dtype, records),))
            elif kind in RAGGED_KINDS:
                dtype = RAGGED_KINDS[kind].newbyteorder("=")
                # sized as batches come (see _projected), or written to a mapped file
                flat: _Growing | SpilledArray = SpilledArray(dtype) if spill else _Growing(dtype, 0)
                lengths = np.dtype(np.int64)
                self._columns.append((flat, SpilledArray(lengths) if spill else _Growing(lengths, records)))
            elif kind in CODED_KINDS:
                self._columns.append((_Growing(np.dtype(object), records),))
            else:
                raise TraceFormatError(f"unknown column kind {kind!r}")
        self.n = 0

    def add(self, batch: dict[str, Any], frame_bytes: int) -> None:
        self._payload_seen += frame_bytes
        for kind, column, part in zip(self.kinds, self._columns, batch["columns"], strict=True):
            if not column:
                continue
            if kind in NUMERIC_KINDS:
                column[0].extend(np.frombuffer(part, NUMERIC_KINDS[kind]))
            elif kind in RAGGED_KINDS:
                dtype = RAGGED_KINDS[kind]
                flat = np.frombuffer(part[0], dtype)
                if column[0].size + len(flat) > column[0].capacity:
                    column[0].reserve(self._projected(column[0].size + len(flat)))
                column[0].extend(flat)
                column[1].extend(np.frombuffer(part[1], "<u4") // dtype.itemsize)
            else:
                distinct, codes = part
                values = np.empty(len(distinct), dtype=object)
                values[:] = list(distinct)
                column[0].extend(values[np.frombuffer(codes, "<u4")])
        self.n += int(batch["n"])

    def _projected(self, items: int) -> int:
        """A ragged column's length for the whole file, from its share of the frames read so far:
        reserved once (a little over), instead of doubling and copying a multi-GB array."""
        return int(1.05 * items * max(1.0, self._payload_bytes / max(self._payload_seen, 1)))

    def into(self, table: ColumnFileData, fields: list[str]) -> ColumnFileData:
        table.n = self.n
        for name, column in zip(fields, self._columns, strict=True):
            if not column:
                continue
            if len(column) == 2:
                table.ragged[name] = (column[0].result(), column[1].result())
            else:
                table.columns[name] = column[0].result()
        return table


_BUFFERS = (bytes, memoryview)


def _batch_fits(batch: dict[str, Any], kinds: list[str], name: str, report: ReadReport, size: int) -> bool:
    """Whether a batch has one column per field, each of `n` rows (every row costs at least a
    byte of the frame's `size`), its values of the column's kind; a bad one is reported."""
    n, columns = batch.get("n"), batch.get("columns")
    ok = isinstance(n, int) and 0 <= n <= size and isinstance(columns, list) and len(columns) == len(kinds)
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
        itemsize = RAGGED_KINDS[kind].itemsize
        return (
            isinstance(column[0], _BUFFERS)
            and int(lengths.sum(dtype=np.int64)) == len(column[0])
            and not np.any(lengths % itemsize)
        )
    if kind in CODED_KINDS:
        codes = np.frombuffer(column[1], "<u4")
        distinct = column[0]
        if not isinstance(distinct, list) or (n and int(codes.max()) >= len(distinct)):
            return False
        return all(map(_is_text if kind == "str" else _is_setting_map, distinct))
    raise TraceFormatError(f"unknown column kind {kind!r}")


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


_SETTING_VALUES = (bool, int, float, str, type(None))


def _is_setting_map(value: Any) -> bool:
    """A map column holds flat maps of names to plain values (the sampling parameters)."""
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, _SETTING_VALUES) for k, v in value.items()
    )


_BIN_SIZE_BYTES = {0xC4: 1, 0xC5: 2, 0xC6: 4}  # msgpack bin 8/16/32: bytes of the length after the marker
_ARRAY_SIZE_BYTES = {**{m: 0 for m in range(0x90, 0xA0)}, 0xDC: 2, 0xDD: 4}
_MAP_SIZE_BYTES = {**{m: 0 for m in range(0x80, 0x90)}, 0xDE: 2, 0xDF: 4}


def _records_of(payload: bytes | memoryview, name: str, report: ReadReport) -> list[Any]:
    """The msgpack records of one frame; a frame that does not decode is reported and dropped.

    A batch's column blobs come back as memoryviews into `payload` rather than copies, and the
    payload is walked in place rather than fed to an Unpacker (which copies it): loading then
    copies each column once, into its final array.
    """
    view = memoryview(payload)
    records: list[Any] = []
    at = 0
    try:
        while at < len(view):
            record, at = _read_map(view, at) if view[at] in _MAP_SIZE_BYTES else _unpack_at(view, at)
            records.append(record)
    except (
        ValueError,
        TypeError,
        IndexError,
        RecursionError,
        msgpack.UnpackException,
        msgpack.OutOfData,
    ) as e:
        # TypeError: a map key Python cannot hash (a list); IndexError: a header cut at the end
        report.warnings.append(f"{name}: frame {report.frames} does not decode ({e}); skipped")
        report.skipped_frames += 1
        return []
    return records


def _read_map(view: memoryview, at: int) -> tuple[dict[Any, Any], int]:
    record: dict[Any, Any] = {}
    count, at = _size_at(view, at, _MAP_SIZE_BYTES)
    for _ in range(count):
        key, at = _unpack_at(view, at)
        if key == "columns" and record.get("type") == "batch" and view[at] in _ARRAY_SIZE_BYTES:
            parts, at = _size_at(view, at, _ARRAY_SIZE_BYTES)
            record[key] = []
            for _ in range(parts):
                part, at = _read_part(view, at, nested=True)
                record[key].append(part)
        else:
            record[key], at = _unpack_at(view, at)
    return record, at


def _read_part(view: memoryview, at: int, nested: bool) -> tuple[Any, int]:
    """A bin as a view into the payload, an array of parts one level deep, anything else decoded."""
    marker = view[at]
    if marker in _BIN_SIZE_BYTES:
        size, start = _size_at(view, at, _BIN_SIZE_BYTES)
        if start + size > len(view):
            raise ValueError(f"bin of {size} bytes at {at} runs past the frame")
        return view[start : start + size], start + size
    if nested and marker in _ARRAY_SIZE_BYTES:
        count, at = _size_at(view, at, _ARRAY_SIZE_BYTES)
        items = []
        for _ in range(count):
            item, at = _read_part(view, at, nested=False)
            items.append(item)
        return items, at
    return _unpack_at(view, at)


def _size_at(view: memoryview, at: int, size_bytes: dict[int, int]) -> tuple[int, int]:
    """The length or count in the msgpack header at `at` (a fix type keeps it in the marker)."""
    marker = view[at]
    width = size_bytes[marker]
    if width == 0:
        return marker & 0x0F, at + 1
    if at + 1 + width > len(view):
        raise ValueError(f"msgpack header at {at} runs past the frame")
    return int.from_bytes(view[at + 1 : at + 1 + width], "big"), at + 1 + width


def _unpack_at(view: memoryview, at: int) -> tuple[Any, int]:
    """One msgpack value at `at`, feeding an Unpacker only as many bytes as the value needs."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(view))
    fed, step = at, 4096
    while True:
        unpacker.feed(view[fed : fed + step])
        fed = min(len(view), fed + step)
        try:
            return unpacker.unpack(), at + unpacker.tell()
        except msgpack.OutOfData:
            if fed >= len(view):
                raise
            step *= 4


def read_column_file(
    path: Source,
    format_name: str,
    max_version: int,
    report: ReadReport,
    *,
    expected: Mapping[str, str] | None = None,
    extras: dict[str, list[dict[str, Any]]] | None = None,
    footer: dict[str, Any] | None = None,
    wanted: Collection[str] | None = None,
    spill: Collection[str] = (),
) -> ColumnFileData:
    """Read one file of `format_name`; damaged frames are skipped and reported, not raised.

    `expected` maps the fields this reader knows to their kinds: a header that declares one of
    them with another kind is refused. Side records (maps of another `type`) are appended to
    `extras` by type; the footer, if present, is copied into `footer`. Batches before the header
    (whose frame was lost) cannot be interpreted; the file then fails with the header error below.
    Nothing is sized from a count or length the file declares beyond what its bytes can hold.
    With `wanted`, only those fields are decoded (and so held); the others are left out of the table.
    Numeric and ragged fields in `spill` go to a temporary file and come back mapped (see trace.mapped).
    """
    name = str(path)
    seen_warnings = len(report.warnings)
    with (
        storage.opened(path) as data,
        contextlib.closing(iter_frame_payloads(data, name, report)) as payloads,
    ):
        report.paths.append(name)
        if report.content is not None:
            report.content.update(data)
        header: dict[str, Any] | None = None
        columns: _ColumnsBeingRead | None = None
        for payload in payloads:
            for item in _records_of(payload, name, report):
                kind = item.get("type") if isinstance(item, dict) else None
                if kind == "batch" and columns is not None:
                    if _batch_fits(item, columns.kinds, name, report, len(payload)):
                        columns.add(item, len(payload))
                elif kind == "header" and header is None:
                    kinds = _kinds_of(item, name, format_name, max_version, expected or {})
                    header = item
                    records, payload_bytes = frame_totals(data)
                    records = min(records, payload_bytes // sum(_MIN_ROW_BYTES[k] for k in kinds))
                    kept = [wanted is None or name in wanted for name in item["fields"]]
                    spilled = [name in spill for name in item["fields"]]
                    columns = _ColumnsBeingRead(kinds, records, payload_bytes, kept, spilled)
                elif kind == "footer":
                    report.footers += 1
                    if footer is not None:
                        footer.update(item)
                elif isinstance(kind, str) and kind not in ("header", "batch") and extras is not None:
                    extras.setdefault(kind, []).append(item)
    if header is None or columns is None:
        damage = "".join(f" ({w.removeprefix(name + ': ')})" for w in report.warnings[seen_warnings:][:1])
        raise TraceFormatError(f"{name}: no header record; not a readable {format_name} file{damage}")
    table = columns.into(ColumnFileData(path, header), header["fields"])
    report.files += 1
    report.records += table.n
    return table


# Bytes a row takes at least in a column of each kind: what a batch of n rows must hold.
_MIN_ROW_BYTES = {"i8": 8, "u8": 8, "b1": 1, "str": 4, "obj": 4, "ragged:u8": 4, "ragged:u4": 4}


def _kinds_of(
    header: dict[str, Any], name: str, format_name: str, max_version: int, expected: Mapping[str, str]
) -> list[str]:
    """The column kinds a header declares, once it is known to be a file this reader can read."""
    if header.get("format") != format_name:
        raise TraceFormatError(f"{name}: is a {_shown(header.get('format'))} file, expected {format_name!r}")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > max_version:
        raise TraceFormatError(
            f"{name}: format version {_shown(version)} is newer than this reader ({max_version}); "
            "upgrade replayproxy"
        )
    fields, kinds = header.get("fields"), header.get("kinds")
    if not isinstance(fields, list) or not fields or not all(isinstance(f, str) for f in fields):
        raise TraceFormatError(f"{name}: header's field list is not a list of names")
    if len(set(fields)) != len(fields) or not isinstance(kinds, dict):
        raise TraceFormatError(f"{name}: header's fields repeat a name, or its kinds are not a map")
    declared = []
    for field_name in fields:
        kind = kinds.get(field_name)
        if not isinstance(kind, str) or kind not in _MIN_ROW_BYTES:
            raise TraceFormatError(
                f"{name}: header gives field {field_name!r} no known kind ({_shown(kind)})"
            )
        if field_name in expected and kind != expected[field_name]:
            raise TraceFormatError(
                f"{name}: header declares field {field_name!r} as {kind}, expected {expected[field_name]}"
            )
        declared.append(kind)
    if not any(kind in NUMERIC_KINDS for kind in declared):
        raise TraceFormatError(f"{name}: header declares no fixed-width column")
    return declared


def _shown(value: Any) -> str:
    """A value from a damaged file, shown short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def with_defaults(
    table: ColumnFileData,
    kinds: Mapping[str, str],
    defaults: Mapping[str, Any],
    wanted: Collection[str] | None = None,
    spill: Collection[str] = (),
) -> ColumnFileData:
    """Fill fields an older (or damaged) file lacks with their defaults, so all files share columns."""
    for name, kind in kinds.items():
        if name in table.columns or name in table.ragged or (wanted is not None and name not in wanted):
            continue
        if name not in defaults:
            raise TraceFormatError(f"{table.path}: lacks the required field {name!r}")
        if kind in RAGGED_KINDS:
            table.ragged[name] = (np.zeros(0, RAGGED_KINDS[kind]), np.zeros(table.n, np.int64))
        elif kind in NUMERIC_KINDS:
            table.columns[name] = np.full(table.n, defaults[name], NUMERIC_KINDS[kind])
        else:
            column = np.empty(table.n, dtype=object)
            column.fill(defaults[name])
            table.columns[name] = column
    return table


T = TypeVar("T")
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # spilling columns to temporary files: the CLI names where


def read_each(paths: list[Source], read: Callable[[Source], T], report: ReadReport) -> list[T]:
    """`read` applied to each file; of several files, one that is empty, unreadable or not of
    the format is skipped and reported (a directory after a full disk reads the rest). Raises
    only when no file could be read."""
    loaded: list[T] = []
    first: Exception | None = None
    for at, path in enumerate(paths):
        storage.prefetch(paths[at : at + storage.AHEAD])
        try:
            loaded.append(read(path))
        except (TraceFormatError, OSError) as e:
            if len(paths) == 1:
                if isinstance(e, OSError) and not isinstance(e, FileAccessError | TraceFormatError):
                    if e.errno not in _DISK_FULL:  # unreadable: the user's to fix, in one line
                        raise FileAccessError(f"{path}: {e.strerror or e}", e.errno) from e
                raise
            first = first or e
            report.skipped_files += 1
            report.warnings.append(f"{path}: skipped: {_cause(e, path)}")
    if not loaded and first is not None:
        raise TraceFormatError(f"no readable file among {len(paths)}: {_cause(first, None)}") from first
    return loaded


def _cause(e: Exception, path: Source | None) -> str:
    text = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    return text.removeprefix(f"{path}: ") if path is not None else text


def expand_paths(paths: Iterable[storage.Named], suffix: str = SUFFIX) -> list[Source]:
    """Files, directories (their *suffix files), globs and object-store URLs (trace.storage), in
    name order; missing ones raise."""
    return storage.expand(paths, suffix)
