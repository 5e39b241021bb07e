"""Reading traces: shapes in arrival order across files, and the fast numpy column loader."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from replayproxy.shape import FIELD_KINDS, FIELDS, RequestShape
from replayproxy.trace.column_file import (
    ColumnFileData,
    expand_paths,
    read_column_file,
    read_each,
    with_defaults,
)
from replayproxy.trace.fleet import join_sessions
from replayproxy.trace.frames import ReadReport
from replayproxy.trace.header import FORMAT_NAME, FORMAT_VERSION, TraceFormatError, TraceHeader
from replayproxy.trace.mapped import is_mapped, mapped_array, release_pages
from replayproxy.trace.storage import Named, ObjectURL, Source, Spilled


def read_trace_files(
    paths: Iterable[Named],
    report: ReadReport | None = None,
    wanted: Collection[str] | None = None,
    spill: Collection[str] = (),
) -> list[tuple[TraceHeader, ColumnFileData]]:
    """Every trace file's header and rows (only the `wanted` fields, if given), oldest start first;
    ragged fields in `spill` are kept in a mapped temporary file (trace.mapped). A file holding
    the same records as one read before (a segment uploaded twice, or named twice) is dropped."""
    report = report if report is not None else ReadReport()
    pairs = read_each(expand_paths(paths), lambda path: _read_trace(path, report, wanted, spill), report)
    pairs = _distinct(pairs, report)
    pairs.sort(key=lambda pair: pair[0].start_wall_ns)
    return pairs


def _distinct(
    pairs: list[tuple[TraceHeader, ColumnFileData]], report: ReadReport
) -> list[tuple[TraceHeader, ColumnFileData]]:
    """The files whose records were not seen in an earlier one: same header (which carries the
    file's own creation time) and the same arrival offsets. A duplicate's records leave the count."""
    seen: dict[bytes, str] = {}
    kept = []
    for header, table in pairs:
        identity = hashlib.blake2b(repr(sorted(table.header.items())).encode(), digest_size=16)
        identity.update(table.n.to_bytes(8, "little"))
        identity.update(np.ascontiguousarray(table.columns["offset_ns"]).data)
        key = identity.digest()
        if key in seen:
            report.duplicate_files += 1
            report.records -= table.n
            report.warnings.append(f"{table.path}: the same records as {seen[key]}; read once")
            continue
        seen[key] = str(table.path)
        kept.append((header, table))
    return kept


def _read_trace(
    path: Source, report: ReadReport, wanted: Collection[str] | None, spill: Collection[str]
) -> tuple[TraceHeader, ColumnFileData]:
    table = read_column_file(
        path, FORMAT_NAME, FORMAT_VERSION, report, expected=FIELD_KINDS, wanted=wanted, spill=spill
    )
    if "offset_ns" not in table.header["fields"]:
        raise TraceFormatError(f"{path}: lacks the required field 'offset_ns'")
    try:
        return TraceHeader.from_record(table.header), table
    except TraceFormatError as e:
        raise TraceFormatError(f"{path}: {e}") from e


RAGGED = ("prefix_hashes", "chunk_gaps_us", "join_ids")
SCALAR_FIELDS = tuple(name for name in FIELDS if name not in RAGGED)


@dataclass(slots=True)
class Columns:
    """A whole trace as numpy arrays, sorted by arrival; ragged fields are flat + index arrays.

    Request i's prefix hashes are `prefix_hashes[prefix_index[i]:prefix_index[i + 1]]` (chunk gaps and
    join ids alike, with `chunk_index` and `join_index`).
    `scalar` holds the other fields by name; each is also an attribute (`columns.input_tokens`),
    set from `scalar` on construction, so `dataclasses.replace(columns, scalar=...)` keeps them in step.
    A field left out of the load (`load(..., fields=...)`) has no attribute: reading it fails loudly.
    """

    headers: list[TraceHeader]
    report: ReadReport
    scalar: dict[str, np.ndarray]
    prefix_hashes: np.ndarray
    prefix_index: np.ndarray
    chunk_gaps_us: np.ndarray
    chunk_index: np.ndarray
    join_ids: np.ndarray
    join_index: np.ndarray
    # The scalar fields of shape.FIELDS, in its order (tests/trace checks that they agree).
    offset_ns: np.ndarray = field(init=False)
    endpoint: np.ndarray = field(init=False)
    model: np.ndarray = field(init=False)
    stream: np.ndarray = field(init=False)
    input_tokens: np.ndarray = field(init=False)
    output_tokens: np.ndarray = field(init=False)
    output_estimated: np.ndarray = field(init=False)
    max_tokens: np.ndarray = field(init=False)
    sampling: np.ndarray = field(init=False)
    roles: np.ndarray = field(init=False)
    has_tools: np.ndarray = field(init=False)
    has_response_format: np.ndarray = field(init=False)
    prefix_units: np.ndarray = field(init=False)
    status: np.ndarray = field(init=False)
    error: np.ndarray = field(init=False)
    ttft_ns: np.ndarray = field(init=False)
    e2e_ns: np.ndarray = field(init=False)
    cached_tokens: np.ndarray = field(init=False)
    session: np.ndarray = field(init=False)
    turn: np.ndarray = field(init=False)
    method: np.ndarray = field(init=False)
    request_bytes: np.ndarray = field(init=False)
    response_bytes: np.ndarray = field(init=False)
    think_ns: np.ndarray = field(init=False)
    chat_id: np.ndarray = field(init=False)
    parent_id: np.ndarray = field(init=False)
    tool_chars: np.ndarray = field(init=False)
    request_type: np.ndarray = field(init=False)
    usage_source: np.ndarray = field(init=False)
    spawned: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        for name in SCALAR_FIELDS:
            if name in self.scalar:
                setattr(self, name, self.scalar[name])

    def __len__(self) -> int:
        return len(self.offset_ns)

    def release(self, rows: slice) -> None:
        """Drop the resident pages of mapped scalar columns over `rows` (consecutive), once read."""
        for column in self.scalar.values():
            release_pages(column[rows])

    def hashes_of(self, i: int) -> np.ndarray:
        return self.prefix_hashes[self.prefix_index[i] : self.prefix_index[i + 1]]

    def joins_of(self, i: int) -> np.ndarray:
        return self.join_ids[self.join_index[i] : self.join_index[i + 1]]

    def message_counts(self, rows: slice) -> np.ndarray:
        """Messages per request of `rows` (consecutive): the length of each one's roles."""
        return np.fromiter((len(r) for r in self.roles[rows]), dtype=np.int64)


def require_requests(columns: Columns, paths: Iterable[Named]) -> None:
    """Refuse traces with no readable request, in one line that says what the read skipped."""
    if len(columns):
        return
    skipped = columns.report.warnings
    losses = f" ({'; '.join(skipped)})" if skipped else ""
    raise TraceFormatError(f"{', '.join(map(str, paths))}: no request could be read{losses}")


def load(
    paths: Named | Iterable[Named],
    *,
    digest: bool = False,
    fields: Collection[str] | None = None,
    ragged_on_disk: bool = False,
    scalars_on_disk: bool = False,
) -> Columns:
    """Load traces into columns: the fast path for inspect, export and replay planning.

    With `fields`, only those scalar fields (plus `offset_ns`, which orders the rows) and the
    ragged ones are read and held: an export of a few columns need not keep all of them.

    With `ragged_on_disk`, the ragged fields (prefix hashes, chunk gaps: the columns that grow with
    requests × blocks) are kept in a mapped temporary file, not on the heap; a reader going through
    them a chunk at a time calls `trace.release_pages` on each range it is done with.
    With `scalars_on_disk` as well, the numeric scalar fields are mapped too (an export of millions of
    requests reads them a chunk at a time: `Columns.release` drops a range it is done with), so
    what stays on the heap is the text fields' references and the arrival order.

    With `digest`, `report.content` is the sha256 of the files' bytes in path order, taken from
    the bytes read here (so a replay need not read its trace twice to name it in its results).
    """
    if isinstance(paths, str | os.PathLike | ObjectURL | Spilled):
        paths = [paths]
    report = ReadReport(content=hashlib.sha256() if digest else None)
    wanted = None if fields is None else {"offset_ns", *RAGGED, *fields}
    ragged_on_disk |= scalars_on_disk
    spill = (*RAGGED, *(SCALAR_FIELDS if scalars_on_disk else ())) if ragged_on_disk else ()
    pairs = read_trace_files(paths, report, wanted, spill)
    base = pairs[0][0].start_wall_ns
    tables = [_with_defaults(table, wanted) for _, table in pairs]
    for (header, _), table in zip(pairs, tables, strict=True):
        if header.start_wall_ns != base:
            table.columns["offset_ns"] = take_rows(
                table.columns["offset_ns"], None, header.start_wall_ns - base
            )
    names = [name for name in SCALAR_FIELDS if wanted is None or name in wanted]
    scalar = {name: _joined([t.columns[name] for t in tables], scalars_on_disk) for name in names}
    sort = np.argsort(scalar["offset_ns"], kind="stable")
    release_pages(scalar["offset_ns"])
    order = None if _is_identity(sort) else sort  # None: already in arrival order, nothing moves
    del sort
    if order is not None:
        scalar = {name: take_rows(column, order) for name, column in scalar.items()}
    if len(pairs) > 1:  # turns of one conversation recorded by several sidecars (or restarts)
        report.joined_turns = join_sessions(scalar)
    ragged = {
        name: _reorder_ragged(
            _joined([t.ragged[name][0] for t in tables], ragged_on_disk),
            _joined([t.ragged[name][1] for t in tables], ragged_on_disk),
            order,
            ragged_on_disk,
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
        join_ids=ragged["join_ids"][0],
        join_index=ragged["join_ids"][1],
    )


def _with_defaults(table: ColumnFileData, wanted: Collection[str] | None) -> ColumnFileData:
    """Fill fields an older file lacks with the shape's defaults, so all tables share columns."""
    return with_defaults(table, FIELD_KINDS, _DEFAULTS, wanted)


_DEFAULTS = RequestShape(offset_ns=0)._asdict()


REORDERED_ROWS = 1 << 16  # rows of a mapped ragged column gathered at a time


def _reorder_ragged(
    flat: np.ndarray, lengths: np.ndarray, order: np.ndarray | None, on_disk: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Permute rows of a flat ragged array given per-row lengths (`order` None: they are in order);
    returns flat and its index. A mapped one stays mapped: out of order, it is gathered into a new
    map a chunk of rows at a time; mapped lengths give a mapped index."""
    index = row_starts(lengths)
    if order is None:
        return flat, index
    if not on_disk:
        return ragged_rows(flat, index, order)
    return mapped_array(_gathered(flat, index, order), flat.dtype), row_starts(take_rows(lengths, order))


def row_starts(lengths: np.ndarray) -> np.ndarray:
    """Each row's start in the flat array, and the end: 0 then the running sum of `lengths` (of a
    mapped column, a new map written a chunk at a time)."""
    if not is_mapped(lengths):
        index = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=index[1:])
        return index

    def sums() -> Iterator[np.ndarray]:
        total = 0
        yield np.zeros(1, np.int64)
        for lo in range(0, len(lengths), REORDERED_ROWS):
            part = np.cumsum(lengths[lo : lo + REORDERED_ROWS], dtype=np.int64) + total
            yield part
            total = int(part[-1])
            release_pages(lengths)

    return mapped_array(sums(), np.int64)


def _gathered(flat: np.ndarray, index: np.ndarray, order: np.ndarray) -> Iterator[np.ndarray]:
    """The rows of a mapped ragged column in `order`, a chunk of rows at a time; the pages read
    for a chunk are dropped after it."""
    for start in range(0, len(order), REORDERED_ROWS):
        yield ragged_rows(flat, index, order[start : start + REORDERED_ROWS])[0]
        release_pages(flat)


def ragged_rows(flat: np.ndarray, index: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The `rows` of a ragged column (row i is `flat[index[i]:index[i + 1]]`), laid end to end in
    that order, and their index. Gathered in one step, not row by row: a window of a trace has
    millions of rows. A run of consecutive rows is a view of `flat`; any other order a copy."""
    rows = np.asarray(rows, np.int64)
    starts = index[:-1][rows].astype(np.int64)
    lengths = index[1:][rows].astype(np.int64) - starts
    taken = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=taken[1:])
    if len(rows) and bool(np.all(np.diff(rows) == 1)):
        return flat[int(starts[0]) : int(starts[0]) + int(taken[-1])], taken
    within = np.arange(int(taken[-1]), dtype=np.int64) - np.repeat(taken[:-1], lengths)
    return flat[within + np.repeat(starts, lengths)], taken


def take_rows(column: np.ndarray, rows: np.ndarray | None, shift: int = 0) -> np.ndarray:
    """`column[rows] + shift` (rows None: every row as it is); a mapped column becomes a new map,
    filled a chunk of rows at a time, each chunk's source pages dropped after it."""
    if not is_mapped(column):
        taken = column if rows is None else column[rows]
        return taken + shift if shift else taken
    count = len(column) if rows is None else len(rows)
    chunks = (
        column[slice(lo, lo + REORDERED_ROWS) if rows is None else rows[lo : lo + REORDERED_ROWS]] + shift
        for lo in range(0, count, REORDERED_ROWS)
    )
    return mapped_array(_dropping(chunks, column), column.dtype)


def _dropping(chunks: Iterator[np.ndarray], source: np.ndarray) -> Iterator[np.ndarray]:
    for chunk in chunks:
        yield chunk
        release_pages(source)


def _joined(arrays: list[np.ndarray], on_disk: bool = False) -> np.ndarray:
    if len(arrays) == 1:
        return arrays[0]
    mappable = on_disk and arrays[0].dtype != object  # text fields stay references on the heap
    return mapped_array(arrays, arrays[0].dtype) if mappable else np.concatenate(arrays)


def _is_identity(order: np.ndarray) -> bool:
    return bool(np.array_equal(order, np.arange(len(order))))
