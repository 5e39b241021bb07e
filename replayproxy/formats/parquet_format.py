"""Parquet export (optional extra `pyarrow`): the columns of `request_columns.COLUMNS`, lists kept,
written a row group at a time."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.errors import BadOption
from replayproxy.formats.exporting import ExportOptions, ExportResult
from replayproxy.formats.request_columns import COLUMNS, RAGGED, header_note, request_columns
from replayproxy.trace import Columns
from replayproxy.trace.mapped import release_pages

ROW_GROUP_ROWS = 1 << 16  # rows converted and written at a time: memory does not grow with the trace
ROW_GROUP_VALUES = 1 << 21  # list values (16 MiB of hashes) per row group at most: long prompts hold many


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    try:
        pa = importlib.import_module("pyarrow")
        pq = importlib.import_module("pyarrow.parquet")
    except ImportError as e:
        raise BadOption("parquet export needs pyarrow: pip install 'replayproxy[parquet]'") from e
    note = header_note(cols)
    metadata = {b"replayproxy.note": note.encode(), b"replayproxy.columns": repr(COLUMNS).encode()}
    indexes = {name: getattr(cols, index) for name, (_, index) in RAGGED.items()}
    # lists past 2**31 values need 64-bit offsets: one type for every row group
    wide = {name: int(index[-1]) >= 2**31 for name, index in indexes.items()}
    texts: dict[int, str] = {}
    writer = None
    try:
        for lo, hi in _row_groups(list(indexes.values()), len(cols)):
            columns = request_columns(cols, slice(lo, hi), texts)
            arrays = {
                name: _arrow(pa, columns[name], kind, wide.get(name, False)) for name, kind in COLUMNS.items()
            }
            table = pa.table(arrays)
            table = table.replace_schema_metadata(metadata)
            if writer is None:
                writer = pq.ParquetWriter(str(path), table.schema, compression="zstd")
            writer.write_table(table)
            for name in RAGGED:
                release_pages(columns[name][0])  # Arrow read them in place
            cols.release(slice(lo, hi))
    finally:
        if writer is not None:
            writer.close()
    return ExportResult(len(cols), [note, f"duckdb -c \"SELECT count(*) FROM '{path}'\""])


def _row_groups(indexes: list[np.ndarray], n: int) -> list[tuple[int, int]]:
    """Row ranges of at most ROW_GROUP_ROWS rows and, past one row, ROW_GROUP_VALUES values in
    any list column (`indexes`: each one's row starts), so one group's Arrow copies stay a few tens of MiB."""
    if n == 0:
        return [(0, 0)]  # an empty file still gets its schema
    groups: list[tuple[int, int]] = []
    lo = 0
    while lo < n:
        hi = min(n, lo + ROW_GROUP_ROWS)
        for index in indexes:
            fits = int(np.searchsorted(index, index[lo] + ROW_GROUP_VALUES, side="right")) - 1
            hi = min(hi, max(fits, lo + 1))
        groups.append((lo, hi))
        lo = hi
    return groups


def _arrow(pa: Any, value: Any, kind: str, wide: bool) -> Any:
    """One column's values of a row group as an Arrow array."""
    if isinstance(value, tuple):
        values, index = value
        item = pa.uint64() if kind == "list<uint64>" else pa.uint32()
        lists = pa.LargeListArray if wide else pa.ListArray
        offsets = pa.array(index, pa.int64() if wide else pa.int32())
        return lists.from_arrays(offsets, pa.array(values, item))
    if kind == "string":
        return pa.array(value.tolist(), pa.string())
    return pa.array(np.asarray(value))
