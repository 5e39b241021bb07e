"""Azure LLM inference traces (Azure/AzurePublicDataset): 2023 (Splitwise) and 2024 (DynamoLLM) layouts.

CSV `TIMESTAMP,ContextTokens,GeneratedTokens`. 2023 files write `2023-11-16 18:15:46.6805900`
(7 fractional digits, no zone, read as UTC) and end without a newline; the 2024 week-long files
write `2024-05-10 00:00:00.009930+00:00`, some rows without a fraction. The 2025 multimodal file
adds `NumImages` and ISO `...T...Z` times; extra columns are ignored. No prefix information.
"""

from __future__ import annotations

import warnings
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from replayproxy.formats.importing import (
    BadLines,
    Imported,
    ImportOptions,
    csv_problem,
    drop_rows,
    keep_good,
    read_csv,
    same_width,
)

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read(path: Path, options: ImportOptions) -> Imported:
    bad = BadLines(str(path), options.skip_bad)
    where, rows, line_nos = read_csv(path, COLUMNS, bad)
    at = [where[name] for name in COLUMNS]
    try:
        same_width(rows, len(where))
        times, inputs, outputs = _convert(rows, at)
    except ValueError:
        rows, line_nos = keep_good(
            rows, line_nos, csv_problem(len(where), lambda row: _problem(row, at)), bad
        )
        times, inputs, outputs = _convert(rows, at)
    keep = drop_rows(
        (inputs < 0) | (outputs < 0),
        lambda i: f"negative token count ({inputs[i]}, {outputs[i]})",
        line_nos,
        bad,
    )
    stamps = [rows[i][at[0]] for i in keep.tolist()]
    return Imported(
        source="azure",
        offset_ns=times[keep],
        input_tokens=inputs[keep],
        output_tokens=outputs[keep],
        bad=bad,
        wall_clock=True,
        columns={"model": options.model} if options.model else {},
        warnings=zone_warnings(stamps, [line_nos[i] for i in keep.tolist()], times[keep], str(path)),
    )


def _convert(rows: list[list[str]], at: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorized: UTC nanoseconds, context tokens, generated tokens (raises ValueError on bad cells)."""
    texts = [row[at[0]].strip() for row in rows]
    inputs = (
        np.array([row[at[1]] for row in rows], dtype=object).astype(np.int64)
        if rows
        else np.zeros(0, np.int64)
    )
    outputs = (
        np.array([row[at[2]] for row in rows], dtype=object).astype(np.int64)
        if rows
        else np.zeros(0, np.int64)
    )
    return times_ns(texts), inputs, outputs


def zone_of(text: str) -> str:
    """The zone a date-time names: "" (none, read as UTC), "Z" or an offset like "+02:00"."""
    text = text.strip()
    if text.endswith("Z"):
        return "Z"
    tail = text[-6:]
    return tail if len(tail) == 6 and tail[0] in "+-" and tail[3] == ":" else ""


def zone_warnings(texts: list[str], line_nos: list[int], times: np.ndarray, path: str) -> list[str]:
    """Rows whose zone differs from the first row's are placed by their own offset; say so.

    One odd offset in a file usually means an edited or merged file: each row is still placed at its
    true UTC instant, but the user should know the timeline moved (and where the start went).
    """
    zones = [zone_of(t) for t in texts]
    odd = [i for i, zone in enumerate(zones) if zone != zones[0]]
    if not odd:
        return []
    named = sorted({zones[i] or "none" for i in odd})
    earliest = int(np.argmin(times))
    moved = ""
    if times[earliest] < times[0]:
        ahead = (int(times[0]) - int(times[earliest])) / 60e9
        moved = f"; the trace starts at line {line_nos[earliest]}, {ahead:.0f} min before the first row"
    return [
        f"{path}:{line_nos[odd[0]]}: {len(odd)} rows name another zone ({', '.join(named)}) than the "
        f"first row ({zones[0] or 'none, read as UTC'}); each is converted to UTC by its own offset{moved}"
    ]


def times_ns(texts: list[str]) -> np.ndarray:
    """UTC nanoseconds of ISO-like date-times; a time without a zone is taken as UTC."""
    plain = [t[:-6] if t.endswith("+00:00") else t[:-1] if t.endswith("Z") else t for t in texts]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy warns (not raises) on zone offsets it would convert
            return np.array(plain, "datetime64[ns]").astype(np.int64)
    except (ValueError, Warning):
        return np.array([time_ns(t) for t in texts], np.int64)


def time_ns(text: str) -> int:
    """One date-time in UTC nanoseconds (the slow, exact path; raises ValueError)."""
    moment = datetime.fromisoformat(text.strip())
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def _problem(row: list[str], at: list[int]) -> str | None:
    try:
        time_ns(row[at[0]])
    except ValueError:
        return f"TIMESTAMP {row[at[0]]!r} is not a date-time"
    for name, i in zip(COLUMNS[1:], at[1:], strict=True):
        try:
            int(row[i])
        except ValueError:
            return f"{name} {row[i]!r} is not an integer"
    return None
