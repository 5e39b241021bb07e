"""replayproxy's own JSON-lines workload format, for hand-made workloads (documented in docs/formats.md).

One object per request: `offset_s` (or `offset_ms`), `input_tokens`, and optionally
`output_tokens`, `max_tokens`, `model`, `endpoint`, `stream`, `session`, `turn`, `status`, `error`
and `prefix` — a list of `[name, tokens]` segments the prompt starts with (a name stands for fixed
text, so a shorter segment of the same name is a prefix of a longer one). Two requests share a
`--block-size` block exactly when their segments agree up to the end of that block.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from replayproxy.formats.blocks import block_ids
from replayproxy.formats.exporting import ExportOptions, ExportResult, session_labels, write_json_lines
from replayproxy.formats.importing import (
    BadLines,
    Imported,
    ImportOptions,
    keep_good,
    key_of,
    read_json_lines,
)
from replayproxy.shape import ENDPOINTS, ERROR_CLASSES, UNKNOWN
from replayproxy.trace import Columns

DEFAULT_BLOCK = 16
_INTS = ("input_tokens", "output_tokens", "max_tokens", "turn", "status")
_STRINGS = {"model": None, "endpoint": ENDPOINTS, "error": ERROR_CLASSES}


def read(path: Path, options: ImportOptions) -> Imported:
    block = options.block_size or DEFAULT_BLOCK
    bad = BadLines(str(path), options.skip_bad)
    rows, line_nos = read_json_lines(path, bad)
    rows, line_nos = keep_good(rows, line_nos, _problem, bad)
    ids: list[np.ndarray] = []
    fresh = 0
    for row in rows:
        row_ids, fresh = _block_ids(row, block, fresh)
        ids.append(row_ids)
    sessions = np.array([key_of(str(r["session"])) if "session" in r else 0 for r in rows], np.uint64)
    columns: dict[str, Any] = {
        "output_tokens": np.array([r.get("output_tokens", UNKNOWN) for r in rows], np.int64),
        "max_tokens": np.array([r.get("max_tokens", UNKNOWN) for r in rows], np.int64),
        "stream": np.array([bool(r.get("stream", True)) for r in rows]),
        "status": np.array([r.get("status", 200) for r in rows], np.int64),
        "session": sessions,
        "turn": np.array([r.get("turn", 0) for r in rows], np.int64),
    }
    for name in _STRINGS:
        columns[name] = [
            str(r.get(name, options.model if name == "model" else "chat" if name == "endpoint" else ""))
            for r in rows
        ]
    return Imported(
        source="jsonl",
        offset_ns=np.array([_offset_ns(r) for r in rows], np.int64),
        input_tokens=np.array([r["input_tokens"] for r in rows], np.int64),
        output_tokens=columns.pop("output_tokens"),
        bad=bad,
        block_size=block,
        ids=np.concatenate(ids) if ids else np.zeros(0, np.int64),
        id_counts=np.array([len(i) for i in ids], np.int64),
        columns=columns,
    )


def _offset_ns(row: dict[str, Any]) -> int:
    return round(float(row["offset_ms"]) * 1e6) if "offset_ms" in row else round(float(row["offset_s"]) * 1e9)


def _problem(row: dict[str, Any]) -> str | None:
    if ("offset_s" in row) == ("offset_ms" in row):
        return "give exactly one of offset_s and offset_ms"
    offset = row["offset_s"] if "offset_s" in row else row["offset_ms"]
    if type(offset) not in (int, float) or offset < 0:
        return f"offset {offset!r} is not a non-negative number"
    for name in _INTS:
        if name in row and type(row[name]) is not int:
            return f"{name} is {row[name]!r}, not an integer"
    if type(row.get("input_tokens")) is not int or row["input_tokens"] < 0:
        return "input_tokens must be a non-negative integer"
    for name, allowed in _STRINGS.items():
        if name in row and (type(row[name]) is not str or (allowed and row[name] not in allowed)):
            return f"{name} is {row[name]!r}; expected " + (
                f"one of {list(allowed)}" if allowed else "a string"
            )
    prefix = row.get("prefix", [])
    if not isinstance(prefix, list) or not all(
        isinstance(s, list) and len(s) == 2 and type(s[0]) is str and type(s[1]) is int and s[1] > 0
        for s in prefix
    ):
        return 'prefix must be a list of ["name", tokens] segments with positive token counts'
    if sum(s[1] for s in prefix) > row["input_tokens"]:
        return f"prefix segments add up to more than input_tokens ({row['input_tokens']})"
    return None


def _block_ids(row: dict[str, Any], block: int, fresh: int) -> tuple[np.ndarray, int]:
    """Ids of the row's full blocks: equal ids ⇔ equal segment lists up to the block's end."""
    parts: list[np.ndarray] = []
    done = 0  # tokens of the prompt covered so far by whole segments
    prefix = row.get("prefix", [])
    for k, (_, tokens) in enumerate(prefix):
        ends = np.arange((done // block + 1) * block, done + tokens + 1, block)  # block ends inside segment k
        name = orjson.dumps([*prefix[:k], prefix[k][0]]).decode()  # a shorter same-named segment is a prefix
        parts.append((key_of(name) >> 1) + (ends - done))
        done += tokens
    shared = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    unique = row["input_tokens"] // block - len(shared)
    ids = np.concatenate(
        [shared, -1 - fresh - np.arange(unique, dtype=np.int64)]
    )  # negative: never a name's id
    return ids, fresh + unique


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    block = options.block_size or DEFAULT_BLOCK
    rows = write_json_lines(path, _rows(cols, block))
    return ExportResult(rows, [f"replayproxy import {path} --format jsonl --block-size {block} -o TRACE.rpt"])


def _rows(cols: Columns, block: int) -> Iterator[dict[str, Any]]:
    """Shapes as jsonl; shared leading blocks become `[["b<id>", block], ...]` segments."""
    flat, counts = block_ids(cols, block)
    used = np.bincount(flat, minlength=1) if len(flat) else np.zeros(1, np.int64)
    ends = np.cumsum(counts).tolist()
    labels = session_labels(cols)
    seconds = ((cols.offset_ns - (cols.offset_ns[0] if len(cols) else 0)) / 1e9).tolist()
    start = 0
    for i in range(len(cols)):
        row: dict[str, Any] = {
            "offset_s": round(seconds[i], 6),
            "input_tokens": max(int(cols.input_tokens[i]), 0),
        }
        for name in ("output_tokens", "max_tokens"):
            if cols.scalar[name][i] >= 0:
                row[name] = int(cols.scalar[name][i])
        row.update(model=cols.model[i], endpoint=cols.endpoint[i], stream=bool(cols.stream[i]))
        row.update(status=int(cols.status[i]), error=cols.error[i])
        if labels[i] is not None:
            row.update(session=labels[i], turn=int(cols.turn[i]))
        ids = flat[start : ends[i]]
        run = int(np.argmin(used[ids] > 1)) if len(ids) and (used[ids] <= 1).any() else len(ids)
        full = min(run, max(int(cols.input_tokens[i]), 0) // block)
        if full:
            row["prefix"] = [[f"b{b}", block] for b in ids[:full].tolist()]
        start = ends[i]
        yield row
