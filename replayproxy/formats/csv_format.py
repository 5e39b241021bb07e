"""CSV export: one row per request, the columns of `request_columns.COLUMNS`; lists as spaced numbers."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from replayproxy.formats.exporting import ExportOptions, ExportResult
from replayproxy.formats.request_columns import COLUMNS, header_note, request_columns
from replayproxy.trace import Columns


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    columns = request_columns(cols)
    cells: list[list[object]] = []
    for name in COLUMNS:
        value = columns[name]
        if isinstance(value, tuple):
            flat, index = value
            text = flat.astype(str)
            cells.append(
                [" ".join(text[a:b]) for a, b in zip(index[:-1].tolist(), index[1:].tolist(), strict=True)]
            )
        elif value.dtype == np.bool_:
            cells.append(np.where(value, "true", "false").tolist())
        else:
            cells.append(value.tolist())
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows(zip(*cells, strict=True))
    return ExportResult(
        len(cols), [header_note(cols), f"duckdb -c \"SELECT count(*) FROM read_csv_auto('{path}')\""]
    )
