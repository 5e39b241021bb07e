"""CSV export: one row per request, the columns of `request_columns.COLUMNS`; lists as spaced numbers."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.formats.exporting import ExportOptions, ExportResult
from replayproxy.formats.request_columns import COLUMNS, header_note, request_columns
from replayproxy.trace import Columns
from replayproxy.trace.mapped import release_pages

CHUNK_ROWS = 16_384  # rows turned into text at a time: memory does not grow with the trace


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    texts: dict[int, str] = {}
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(COLUMNS)
        for lo in range(0, len(cols), CHUNK_ROWS):
            rows = slice(lo, min(len(cols), lo + CHUNK_ROWS))
            columns = request_columns(cols, rows, texts)
            writer.writerows(zip(*(_cells(columns[name]) for name in COLUMNS), strict=True))
            cols.release(rows)
    return ExportResult(
        len(cols), [header_note(cols), f"duckdb -c \"SELECT count(*) FROM read_csv_auto('{path}')\""]
    )


def _cells(value: Any) -> list[Any]:
    """One column's cells: lists as spaced numbers, booleans as true/false."""
    if isinstance(value, tuple):
        values, index = value
        text = values.astype(str)
        release_pages(values)  # a mapped column is read through, not held
        bounds = index.tolist()
        return [" ".join(text[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    if value.dtype == np.bool_:
        cells: list[Any] = np.where(value, "true", "false").tolist()
        return cells
    return list(value.tolist())
