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

from replayproxy.formats.csv_rows import CsvBatches, csv_problem, same_width
from replayproxy.formats.importing import (
    BadLines,
    Imported,
    ImportOptions,
    SpilledColumns,
    drop_rows,
    keep_good,
)
from replayproxy.shape import MAX_TOKENS

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read(path: Path, options: ImportOptions) -> Imported:
    """Rows a batch at a time: only the three numbers of each request outlive its batch, in
    temporary files."""
    bad = BadLines(str(path), options.skip_bad)
    spilled = SpilledColumns(times=np.int64, inputs=np.int64, outputs=np.int64)
    zones = ZoneCheck(str(path))
    with CsvBatches(path, COLUMNS, bad) as batches:
        at = [batches.where[name] for name in COLUMNS]
        for rows, line_nos in batches:
            times, inputs, outputs = _batch(rows, line_nos, at, len(batches.where), bad, zones)
            spilled.add(times=times, inputs=inputs, outputs=outputs)
    columns = spilled.result()
    return Imported(
        source="azure",
        offset_ns=columns["times"],
        input_tokens=columns["inputs"],
        output_tokens=columns["outputs"],
        bad=bad,
        wall_clock=True,
        columns={"model": options.model} if options.model else {},
        warnings=zones.warnings(),
    )


def _batch(
    rows: list[list[str]], line_nos: list[int], at: list[int], width: int, bad: BadLines, zones: ZoneCheck
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One batch's UTC nanoseconds, context and generated tokens, bad rows reported."""
    try:
        same_width(rows, width)
        times, inputs, outputs = _convert(rows, at)
    except (ValueError, OverflowError):
        rows, line_nos = keep_good(rows, line_nos, csv_problem(width, lambda row: _problem(row, at)), bad)
        times, inputs, outputs = _convert(rows, at)
    keep = drop_rows(
        (inputs < 0) | (outputs < 0) | (inputs > MAX_TOKENS) | (outputs > MAX_TOKENS),
        lambda i: f"token count ({inputs[i]}, {outputs[i]}) is not within 0..{MAX_TOKENS}",
        line_nos,
        bad,
    )
    kept = keep.tolist()
    zones.add([rows[i][at[0]] for i in kept], [line_nos[i] for i in kept], times[keep])
    return times[keep], inputs[keep], outputs[keep]


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


class ZoneCheck:
    """Rows whose zone differs from the first row's are placed by their own offset; say so.

    One odd offset in a file usually means an edited or merged file: each row is still placed at its
    true UTC instant, but the user should know the timeline moved (and where the start went).
    Fed a batch of rows at a time; keeps only what the warning names.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.first_zone: str | None = None
        self.first_ns = 0  # the first row's time
        self.odd = 0
        self.first_odd_line = 0
        self.named: set[str] = set()
        self.earliest: tuple[int, int] | None = None  # (time, line) of the earliest row

    def add(self, texts: list[str], line_nos: list[int], times: np.ndarray) -> None:
        if not texts:
            return
        if self.first_zone is None:
            self.first_zone, self.first_ns = zone_of(texts[0]), int(times[0])
        for text, line_no in zip(texts, line_nos, strict=True):
            zone = zone_of(text)
            if zone != self.first_zone:
                self.odd += 1
                self.first_odd_line = self.first_odd_line or line_no
                self.named.add(zone or "none")
        at = int(np.argmin(times))
        if self.earliest is None or int(times[at]) < self.earliest[0]:
            self.earliest = (int(times[at]), line_nos[at])

    def warnings(self) -> list[str]:
        if not self.odd or self.earliest is None:
            return []
        moved = ""
        if self.earliest[0] < self.first_ns:
            ahead = (self.first_ns - self.earliest[0]) / 60e9
            moved = f"; the trace starts at line {self.earliest[1]}, {ahead:.0f} min before the first row"
        return [
            f"{self.path}:{self.first_odd_line}: {self.odd} rows name another zone "
            f"({', '.join(sorted(self.named))}) than the first row "
            f"({self.first_zone or 'none, read as UTC'}); each is converted to UTC by its own offset{moved}"
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
            if abs(int(row[i])) > MAX_TOKENS:
                return f"{name} {row[i]} is not within 0..{MAX_TOKENS}"
        except ValueError:
            return f"{name} {row[i]!r} is not an integer"
    return None
