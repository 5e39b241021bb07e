"""Flat rows (dicts of numbers, strings and lists) written as CSV, JSON Lines or Parquet.

Used for per-request result rows, which pandas, DuckDB and the peers' analysis scripts expect as
vLLM bench's `--save-detailed` or AIPerf's `profile_export.jsonl` give them. `kinds` names each
column's type (`i8`, `f8`, `b1`, `str`, `ragged:u4`, `ragged:f8`) so an empty or all-null column
still gets its type in Parquet.
"""

from __future__ import annotations

import csv
import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from replayproxy.errors import BadOption

ROW_FORMATS = ("csv", "jsonl", "parquet")


def write_rows(rows: Iterable[dict[str, Any]], kinds: Mapping[str, str], fmt: str, path: Path) -> int:
    """Write every row to `path` in `fmt`; returns the number of rows."""
    if fmt not in ROW_FORMATS:
        raise BadOption(
            f"--format: invalid choice for result files: {fmt!r} (choose from {', '.join(ROW_FORMATS)})"
        )
    if fmt == "parquet":
        return _parquet(list(rows), kinds, path)
    count = 0
    with open(path, "w", newline="", encoding="utf-8") as out:
        if fmt == "jsonl":
            for row in rows:
                out.write(orjson.dumps(row).decode() + "\n")
                count += 1
            return count
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(kinds)
        for row in rows:
            writer.writerow(_csv_cell(row.get(name)) for name in kinds)
            count += 1
    return count


def _csv_cell(value: Any) -> Any:
    """Lists as space-separated numbers (as the trace CSV export), booleans as true/false, null empty."""
    if isinstance(value, list):
        return " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else value


def _parquet(rows: list[dict[str, Any]], kinds: Mapping[str, str], path: Path) -> int:
    try:
        pa = importlib.import_module("pyarrow")
        pq = importlib.import_module("pyarrow.parquet")
    except ImportError as e:
        raise BadOption("parquet export needs pyarrow: pip install 'replayproxy[parquet]'") from e
    scalar = {
        "i8": pa.int64(),
        "f8": pa.float64(),
        "b1": pa.bool_(),
        "str": pa.string(),
        "u4": pa.uint32(),
        "u8": pa.uint64(),
    }

    def arrow_type(kind: str) -> Any:
        return pa.list_(scalar[kind.split(":", 1)[1]]) if kind.startswith("ragged:") else scalar[kind]

    schema = pa.schema([(name, arrow_type(kind)) for name, kind in kinds.items()])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(path), compression="zstd")
    return len(rows)
