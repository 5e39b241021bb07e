"""Parquet export (optional extra `pyarrow`): the columns of `request_columns.COLUMNS`, lists kept."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.errors import BadOption
from replayproxy.formats.exporting import ExportOptions, ExportResult
from replayproxy.formats.request_columns import COLUMNS, header_note, request_columns
from replayproxy.trace import Columns


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    try:
        pa = importlib.import_module("pyarrow")
        pq = importlib.import_module("pyarrow.parquet")
    except ImportError as e:
        raise BadOption("parquet export needs pyarrow: pip install 'replayproxy[parquet]'") from e
    columns = request_columns(cols)
    arrays: dict[str, Any] = {}
    for name, kind in COLUMNS.items():
        value = columns[name]
        if isinstance(value, tuple):
            flat, index = value
            item = pa.uint64() if kind == "list<uint64>" else pa.uint32()
            lists = pa.ListArray if index[-1] < 2**31 else pa.LargeListArray
            offsets = pa.array(index, pa.int32() if lists is pa.ListArray else pa.int64())
            arrays[name] = lists.from_arrays(offsets, pa.array(flat, item))
        elif kind == "string":
            arrays[name] = pa.array(value.tolist(), pa.string())
        else:
            arrays[name] = pa.array(np.asarray(value))
    note = header_note(cols)
    metadata = {b"replayproxy.note": note.encode(), b"replayproxy.columns": repr(COLUMNS).encode()}
    pq.write_table(pa.table(arrays).replace_schema_metadata(metadata), str(path), compression="zstd")
    return ExportResult(len(cols), [note, f"duckdb -c \"SELECT count(*) FROM '{path}'\""])
