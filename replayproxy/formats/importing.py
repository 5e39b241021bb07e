"""What every importer shares: bad-line accounting, source hash ids turned into prefix hashes, writing.

An importer parses its file a batch of lines at a time into `Imported` columns (numpy, one entry per
request; hash ids chained per batch into `ChainedHashes`, which leave memory once they are many) and
`write_imported` writes them with `trace.write_columns`, so a million-line file never becomes a
million Python objects. Streaming readers append each batch's columns to unlinked temporary files
(`SpilledColumns`; strings as codes into a table of the distinct values, `Coded`), and the writer
reads them back mapped, a frame at a time in arrival order, releasing each frame's pages: memory
then follows the frame, not the file (a file out of arrival order adds its sort, 8 bytes a row).
See docs/formats.md for each format's mapping.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import hashlib
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson

from replayproxy.errors import BadInputFile
from replayproxy.formats.chained_hashes import ChainedHashes, take_rows
from replayproxy.formats.idchain import IMPORT_HASH_SCHEME
from replayproxy.shape import UNKNOWN
from replayproxy.trace import TraceHeader, write_columns
from replayproxy.trace.mapped import SpilledArray, release_pages


class ImportFormatError(BadInputFile):
    """A malformed input line; the message names the file, the line and the reason."""


BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark, written by Excel and some Windows tools
MAX_LINE_BYTES = 16 << 20  # no request row needs more (a 16 MiB hash_ids list is ~1.5 M ids)
SPAN_WARNING_S = 30 * 86_400  # an import spanning more than this is probably read in the wrong unit


@dataclass(frozen=True, slots=True)
class ImportOptions:
    """Choices the user states on the command line; None means "the format's documented default"."""

    skip_bad: bool = False
    block_size: int | None = None  # tokens per source hash id
    time_unit: str | None = None  # "ms" | "s" for numeric timestamps
    model: str = ""  # model name for formats that carry none
    drop_failed: bool = False  # leave out requests the source marks as failed
    seed: int = 0  # for sources that are distributions to sample (ServeGen)
    start_s: float = 0.0  # sampled span of such sources: its start and length (None: the format's)
    duration_s: float | None = None


@dataclass(slots=True)
class BadLines:
    """Reports a malformed line: raises at once, or with --skip-bad counts it and goes on."""

    path: str
    skip: bool
    count: int = 0
    first: str = ""

    def __call__(self, line_no: int, reason: str) -> None:
        message = f"{self.path}:{line_no}: {reason}"
        if not self.skip:
            raise ImportFormatError(f"{message} (--skip-bad skips such lines)")
        self.count += 1
        self.first = self.first or message


@dataclass(slots=True)
class Imported:
    """One source file as columns; `hashes` are the chained source hash ids, if the format has any."""

    source: str  # format name, kept as "import:<format>" in the header
    offset_ns: np.ndarray  # arrival, any origin (rebased to the first request when written)
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    bad: BadLines
    block_size: int = 16  # tokens per source id
    hashes: ChainedHashes | None = None
    columns: dict[str, Any] = field(default_factory=dict)  # further shape fields by name
    wall_clock: bool = False  # offset_ns are UTC nanoseconds since the epoch (sources with dates)
    extra: dict[str, Any] = field(default_factory=dict)  # header notes
    warnings: list[str] = field(default_factory=list)  # printed after the import: likely mistakes
    notes: list[str] = field(default_factory=list)  # printed after the import: what it changed

    def __len__(self) -> int:
        return len(self.offset_ns)


@dataclass(frozen=True, slots=True)
class Coded:
    """A string column as codes into its distinct values (a model name, a request type per row)."""

    table: np.ndarray  # the distinct values (object array)
    codes: np.ndarray  # per row, an index into `table`


@dataclass(frozen=True, slots=True)
class Ragged:
    """A ragged column held whole (join ids: a few per joining request): flat values, per-row counts."""

    flat: np.ndarray
    counts: np.ndarray


@dataclass(frozen=True, slots=True)
class TurnsInArrival:
    """The turn column counted in arrival order from a session column (`turns_of`), as it is written."""

    sessions: np.ndarray


class SpilledColumns:
    """A reader's per-request columns, appended a batch at a time to unlinked temporary files and
    mapped when read (`result`), so they never grow the heap; strings are kept as codes."""

    def __init__(self, **dtypes: Any) -> None:
        self._arrays = {name: SpilledArray(np.dtype(dtype)) for name, dtype in dtypes.items()}
        self._tables: dict[str, dict[str, int]] = {}

    def add(self, **values: np.ndarray) -> None:
        for name, column in values.items():
            self._arrays[name].extend(column)

    def add_strings(self, name: str, values: Iterable[str]) -> None:
        """A batch of a string column, coded; the column's first batch creates it."""
        table = self._tables.setdefault(name, {})
        if name not in self._arrays:
            self._arrays[name] = SpilledArray(np.dtype(np.uint32))
        codes = [table.setdefault(value, len(table)) for value in values]
        self._arrays[name].extend(np.array(codes, np.uint32))

    def result(self) -> dict[str, Any]:
        """Every column, mapped; string columns as `Coded`."""
        out: dict[str, Any] = {name: array.result() for name, array in self._arrays.items()}
        for name, table in self._tables.items():
            out[name] = Coded(np.array(list(table), dtype=object), out[name])
        return out


BATCH_BYTES = 4 << 20  # JSON lines are read and parsed this much of the file at a time


def iter_json_lines(path: Path, bad: BadLines) -> Iterator[tuple[list[Any], Sequence[int]]]:
    """Parsed objects and their 1-based line numbers, a batch of lines at a time (memory bounded by
    the batch, whatever the file); blank lines are ignored.

    The fast path parses a batch in one comprehension; a batch with a blank or broken line is
    parsed again line by line, so the bad line is found and named. A line longer than
    MAX_LINE_BYTES is never held: only its length reaches the bad-line report.
    """
    loads = orjson.loads
    for first_no, lines in _line_batches(path):
        with paused_gc():
            try:
                if not all(type(line) is bytes for line in lines):
                    raise orjson.JSONDecodeError("line too long", "", 0)
                rows = [loads(line) for line in cast(list[bytes], lines)]
                if all(type(row) is dict for row in rows):
                    yield rows, range(first_no, first_no + len(rows))
                    continue
            except orjson.JSONDecodeError:
                pass
            yield _read_lines(lines, first_no, bad)


def _line_batches(path: Path) -> Iterator[tuple[int, list[bytes | int]]]:
    """The file's lines in batches with the number of each batch's first line; a line over
    MAX_LINE_BYTES comes as its length in bytes instead, and a trailing blank line is dropped."""
    limit = MAX_LINE_BYTES
    next_no = 1
    carry = b""
    skipping = -1  # bytes of an over-long line read so far (-1: not inside one)
    with open_maybe_gzip(path) as stream:
        block = stream.read(BATCH_BYTES)
        block = block[len(BOM) :] if block.startswith(BOM) else block
        while block:
            if skipping >= 0:
                newline = block.find(b"\n")
                if newline < 0:
                    skipping += len(block)
                    block = stream.read(BATCH_BYTES)
                    continue
                yield next_no, [skipping + newline]
                next_no, skipping, block = next_no + 1, -1, block[newline + 1 :]
            parts = (carry + block).split(b"\n")
            tail = parts.pop()
            carry = tail if len(tail) <= limit else b""
            skipping = len(tail) if len(tail) > limit else -1
            lines: list[bytes | int] = (
                [line if len(line) <= limit else len(line) for line in parts]
                if max(map(len, parts), default=0) > limit
                else list(parts)
            )
            if lines:
                yield next_no, lines
                next_no += len(lines)
            block = stream.read(BATCH_BYTES)
    if skipping >= 0:
        yield next_no, [skipping]
    elif carry.strip():
        yield next_no, [carry]


GZIP_MAGIC = b"\x1f\x8b"


def open_maybe_gzip(path: Path) -> Any:
    """The file's bytes, decompressed as they are read when it is gzip (Copilot's shards, Dynamo's
    rotated segments are `.jsonl.gz`): told by its first two bytes, not by its name."""
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == GZIP_MAGIC
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def _read_lines(lines: list[bytes | int], first_no: int, bad: BadLines) -> tuple[list[Any], list[int]]:
    rows: list[Any] = []
    line_nos: list[int] = []
    loads = orjson.loads
    for no, line in enumerate(lines, first_no):
        if isinstance(line, int):
            bad(no, f"a line of {line} bytes: longer than any request row needs ({MAX_LINE_BYTES})")
            continue
        if not line.strip():
            continue
        try:
            row = loads(line)
        except orjson.JSONDecodeError as e:
            bad(no, f"not a JSON object ({e})")
            continue
        if not isinstance(row, dict):
            bad(no, f"expected a JSON object, got {type(row).__name__}")
            continue
        rows.append(row)
        line_nos.append(no)
    return rows, line_nos


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Building millions of small lists and dicts makes the cycle collector run for nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def keep_good(
    rows: list[Any], line_nos: Sequence[int], problem: Callable[[Any], str | None], bad: BadLines
) -> tuple[list[Any], list[int]]:
    """The slow path after a vectorized conversion failed: check each row, report or drop the bad."""
    good: list[Any] = []
    good_nos: list[int] = []
    for row, no in zip(rows, line_nos, strict=True):
        reason = problem(row)
        if reason is None:
            good.append(row)
            good_nos.append(no)
        else:
            bad(no, reason)
    return good, good_nos


def drop_rows(
    mask: np.ndarray, reason: Callable[[int], str], line_nos: Sequence[int], bad: BadLines
) -> np.ndarray:
    """Report rows that a vectorized check flagged; returns the indices of the rows kept."""
    for i in np.flatnonzero(mask).tolist():
        bad(line_nos[i], reason(i))
    return np.flatnonzero(~mask)


def flatten_ids(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-row id lists as one int64 array and per-row counts (raises on anything but ints)."""
    counts = np.fromiter(map(len, lists), np.int64, len(lists))
    flat = np.fromiter(itertools.chain.from_iterable(lists), np.int64, int(counts.sum()))
    return flat, counts


def key_of(text: str) -> int:
    """A stable nonzero 63-bit number for a source's name or session id (already public: not keyed)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, person=b"rp-import").digest()
    return int.from_bytes(digest, "little") >> 1 or 1


def span_warning(imported: Imported) -> list[str]:
    """A trace longer than a month was most likely read in the wrong time unit (or has a stray row)."""
    if len(imported) < 2:
        return []
    lowest, highest = extremes(imported.offset_ns)
    span_s = (highest - lowest) / 1e9
    if span_s <= SPAN_WARNING_S:
        return []
    unit = imported.extra.get("time_unit")
    hint = f" (timestamps read as {unit}: is --time-unit right?)" if unit else ""
    return [f"{imported.bad.path}: the requests span {span_s / 86_400:.0f} days{hint}"]


CHUNK_ROWS = 1 << 20  # rows of a mapped column read at a time by whole-column checks


def chunks(values: np.ndarray) -> Iterator[np.ndarray]:
    """A column a million rows at a time; a mapped column's pages are released after each."""
    for lo in range(0, len(values), CHUNK_ROWS):
        piece = values[lo : lo + CHUNK_ROWS]
        yield piece
        release_pages(piece)


def sorted_columns(columns: dict[str, np.ndarray], order: np.ndarray) -> dict[str, np.ndarray]:
    """Each column gathered in `order`, a chunk of rows at a time, into a new mapped column."""
    out: dict[str, np.ndarray] = {}
    for name, values in columns.items():
        gathered = SpilledArray(values.dtype)
        for rows in chunks(order):
            gathered.extend(values[rows])
            release_pages(values)
        out[name] = gathered.result()
    return out


def extremes(values: np.ndarray) -> tuple[int, int]:
    """The smallest and largest value of a non-empty integer column, read a chunk at a time."""
    found = [(int(piece.min()), int(piece.max())) for piece in chunks(values)]
    return min(low for low, _ in found), max(high for _, high in found)


def unit_warnings(raw: np.ndarray, unit: str, path: str) -> list[str]:
    """Numeric timestamps whose gaps fit the other unit far better: say which flag would fix it.

    A millisecond file read as seconds has a median gap of minutes; a seconds file (fractional
    values) read as milliseconds has sub-millisecond gaps, i.e. thousands of requests a second.
    """
    finite = np.empty(len(raw), np.float64)  # the one copy of the column in memory, sorted in place
    kept = 0
    for piece in chunks(raw):
        good = piece[np.isfinite(piece)]
        finite[kept : kept + len(good)] = good
        kept += len(good)
    finite = finite[:kept]
    finite.sort()
    fractional = sum(int(np.count_nonzero(piece % 1 != 0)) for piece in chunks(finite)) / max(len(finite), 1)
    gaps = np.diff(finite)
    del finite
    gaps = gaps[gaps > 0]
    if len(gaps) < 10:
        return []
    median = float(np.median(gaps, overwrite_input=True))
    if unit == "s" and median >= 60 and fractional < 0.01:
        return [
            f"{path}: read as seconds, the median gap between arrivals is {median:g} s; "
            "if the timestamps are milliseconds, use --time-unit ms"
        ]
    if unit == "ms" and median < 1 and fractional > 0.5:
        return [
            f"{path}: read as milliseconds, the median gap between arrivals is {median:g} ms "
            f"({1000 / median:.0f} req/s); if the timestamps are seconds, use --time-unit s"
        ]
    return []


def turns_of(sessions: np.ndarray, seen: dict[int, int] | None = None) -> np.ndarray:
    """0-based turn of each request within its session (rows in arrival order; 0 = no session);
    `seen` (turns so far per session) carries the count from earlier rows."""
    turns = np.zeros(len(sessions), np.int64)
    seen = {} if seen is None else seen
    for i, s in enumerate(sessions.tolist()):
        if s:
            turns[i] = seen.get(s, 0)
            seen[s] = turns[i] + 1
    return turns


def write_imported(imported: Imported, path: str | os.PathLike[str], wall_ns: Callable[[], int]) -> int:
    """Sort by arrival, rebase to the first request, derive prefix hashes and write the trace.

    Columns are taken a frame at a time, in arrival order, from the reader's (mapped) columns. A
    file already in arrival order (most published traces) is written without any sort.
    """
    n = len(imported)
    stamps = imported.offset_ns
    rows = _ArrivalRows(arrival_order(stamps))
    origin = int(stamps[rows.order[0]] if rows.order is not None else stamps[0]) if n else 0
    columns: dict[str, Any] = {name: rows.column(value) for name, value in imported.columns.items()}
    columns.setdefault("status", 200)  # published traces list served requests unless they say otherwise
    inputs = imported.input_tokens
    columns.update(
        offset_ns=lambda lo, hi: rows.take(stamps, lo, hi) - origin,
        input_tokens=rows.column(inputs),
        output_tokens=rows.column(imported.output_tokens),
    )
    if imported.hashes is not None:
        had_ids = imported.hashes.had_ids()
        columns["prefix_hashes"] = (
            imported.hashes.rows_in(rows.order),
            rows.column(imported.hashes.counts()),
        )
        columns["prefix_units"] = lambda lo, hi: np.where(
            rows.take(had_ids, lo, hi), rows.take(inputs, lo, hi), UNKNOWN
        )
    header = TraceHeader(
        start_wall_ns=origin if imported.wall_clock else 0,
        source=f"import:{imported.source}",
        block_size=imported.block_size,
        block_unit="token",
        hash_scheme=IMPORT_HASH_SCHEME,
        extra={"skipped_lines": imported.bad.count, **imported.extra},
    )
    return write_columns(path, header, columns, n, wall_ns=wall_ns, frame_records=_frame_records(imported))


def arrival_order(stamps: np.ndarray) -> np.ndarray | None:
    """None for a column already in arrival order (checked a chunk at a time), else its stable
    argsort (8 bytes a row, the one per-row array an import keeps in memory)."""
    last = len(stamps) - 1
    ends = [(lo, min(lo + CHUNK_ROWS, last)) for lo in range(0, max(last, 0), CHUNK_ROWS)]
    in_order = all(bool((stamps[lo + 1 : hi + 1] >= stamps[lo:hi]).all()) for lo, hi in ends)
    release_pages(stamps)
    if in_order:
        return None
    order = np.argsort(stamps, kind="stable")
    release_pages(stamps)
    return order


class _ArrivalRows:
    """Rows [lo, hi) in arrival order from columns in the reader's order; a mapped column's pages
    are released after each frame, so reading it whole never makes it resident."""

    def __init__(self, order: np.ndarray | None) -> None:
        self.order = order

    def take(self, values: np.ndarray, lo: int, hi: int) -> np.ndarray:
        if self.order is None:
            piece = np.array(values[lo:hi])  # a copy: it outlives the released pages
            release_pages(values[lo:hi])
        else:
            piece = values[self.order[lo:hi]]
            release_pages(values)
        return piece

    def column(self, values: Any) -> Any:
        """A column as `write_columns` takes it: a function of the row range, or one value."""
        if isinstance(values, Coded):
            return lambda lo, hi: values.table[self.take(values.codes, lo, hi)]
        if isinstance(values, TurnsInArrival):
            return self._turns(values.sessions)
        if isinstance(values, Ragged):
            if self.order is None:
                return values.flat, values.counts
            order = self.order
            return lambda lo, hi: take_rows(values.flat, values.counts, order[lo:hi]), values.counts[order]
        if isinstance(values, list):
            values = values if self.order is None else np.asarray(values, dtype=object)[self.order]
            return values
        if isinstance(values, np.ndarray):
            return lambda lo, hi: self.take(values, lo, hi)
        return values

    def _turns(self, sessions: np.ndarray) -> Callable[[int, int], np.ndarray]:
        """`turns_of` over the sessions in arrival order, a frame at a time (frames come in order)."""
        seen: dict[int, int] = {}

        def turns(lo: int, hi: int) -> np.ndarray:
            return turns_of(self.take(sessions, lo, hi), seen)

        return turns


FRAME_HASHES = 1 << 21  # about this many prefix hashes (16 MiB) per written frame


def _frame_records(imported: Imported) -> int:
    """Requests per frame: 65,536, fewer when prompts hold thousands of blocks, so that one frame's
    hashes, read back from the temporary file and encoded, stay a few MiB."""
    if imported.hashes is None or not len(imported):
        return 1 << 16
    per_request = max(imported.hashes.total / len(imported), 1.0)
    return int(min(max(FRAME_HASHES / per_request, 1024), 1 << 16))
