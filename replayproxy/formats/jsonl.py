"""replayproxy's own JSON-lines workload format, for hand-made workloads (documented in docs/formats.md).

One object per request: `offset_s` (or `offset_ms`), `input_tokens`, and optionally
`output_tokens`, `max_tokens`, `model`, `endpoint`, `stream`, `session`, `turn`, `status`, `error`
and `prefix` — a list of `[name, tokens]` segments the prompt starts with (a name stands for fixed
text, so a shorter segment of the same name is a prefix of a longer one). Two requests share a
`--block-size` block exactly when their segments agree up to the end of that block.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.formats.blocks import ReuseTally, export_block, is_repeated, iter_block_ids, repeated_ids
from replayproxy.formats.chained_hashes import ChainedHashes
from replayproxy.formats.exporting import ExportOptions, ExportResult, SessionLabels, write_json_lines
from replayproxy.formats.importing import (
    BadLines,
    Imported,
    ImportOptions,
    SpilledColumns,
    iter_json_lines,
    keep_good,
    key_of,
)
from replayproxy.shape import ENDPOINTS, ERROR_CLASSES, MAX_OFFSET_S, MAX_TOKENS, UNKNOWN
from replayproxy.trace import Columns

DEFAULT_BLOCK = 16
_INTS = ("input_tokens", "output_tokens", "max_tokens", "turn", "status")
_STRINGS = {"model": None, "endpoint": ENDPOINTS, "error": ERROR_CLASSES}
_RANGES = {  # what a request can have (a larger count would size arrays: refused first)
    "input_tokens": (0, MAX_TOKENS), "output_tokens": (UNKNOWN, MAX_TOKENS),
    "max_tokens": (UNKNOWN, MAX_TOKENS), "turn": (0, 1 << 31), "status": (0, 999),
}  # fmt: skip
GROUP_BLOCKS = 1 << 21  # blocks numbered at a time (16 MiB of ids): a batch of long prompts is split


def read(path: Path, options: ImportOptions) -> Imported:
    """Columns a batch of lines at a time, so no line's dict outlives its batch; each batch's
    columns go to temporary files (strings as codes) at once."""
    block = options.block_size or DEFAULT_BLOCK
    bad = BadLines(str(path), options.skip_bad)
    spilled = SpilledColumns(**_NUMERIC)
    hashes = ChainedHashes(block)
    fresh = 0
    names: dict[str, str] = {}  # one string object per distinct model / endpoint / error
    for lines, line_nos in iter_json_lines(path, bad):
        good, _ = keep_good(lines, line_nos, _problem, bad)
        for rows in _groups(good, block):
            batch, fresh = _columns(rows, block, fresh, options.model, names)
            hashes.add(batch.pop("ids"), batch["id_counts"], batch["input_tokens"])
            spilled.add(**{name: batch[name] for name in _NUMERIC})
            for name in _STRINGS:
                spilled.add_strings(name, batch[name])
    columns = spilled.result()
    for name in _STRINGS:
        columns.setdefault(name, [])
    return Imported(
        source="jsonl",
        offset_ns=columns.pop("offset_ns"),
        input_tokens=columns.pop("input_tokens"),
        output_tokens=columns.pop("output_tokens"),
        bad=bad,
        block_size=block,
        hashes=hashes,
        columns=columns,
    )


def _groups(rows: list[dict[str, Any]], block: int) -> Iterator[list[dict[str, Any]]]:
    """Consecutive rows holding about GROUP_BLOCKS full blocks each (a row alone if it has more)."""
    ends = np.cumsum([row["input_tokens"] // block for row in rows]) // GROUP_BLOCKS
    cuts = np.flatnonzero(np.diff(ends)) + 1
    for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(rows)], strict=True):
        if hi > lo:
            yield rows[lo:hi]


_NUMERIC = {
    "offset_ns": np.int64, "input_tokens": np.int64, "output_tokens": np.int64, "max_tokens": np.int64,
    "stream": np.bool_, "status": np.int64, "session": np.uint64, "turn": np.int64,
}  # fmt: skip


def _columns(
    rows: list[dict[str, Any]], block: int, fresh: int, model: str, names: dict[str, str]
) -> tuple[dict[str, Any], int]:
    """One batch of checked rows as columns; `fresh` numbers the unshared blocks across batches."""
    ids, counts, fresh = _block_ids(rows, block, fresh)
    defaults = {"model": model, "endpoint": "chat", "error": ""}
    batch: dict[str, Any] = {
        "offset_ns": np.array([_offset_ns(r) for r in rows], np.int64),
        "input_tokens": np.array([r["input_tokens"] for r in rows], np.int64),
        "output_tokens": np.array([r.get("output_tokens", UNKNOWN) for r in rows], np.int64),
        "max_tokens": np.array([r.get("max_tokens", UNKNOWN) for r in rows], np.int64),
        "stream": np.array([bool(r.get("stream", True)) for r in rows], np.int64),
        "status": np.array([r.get("status", 200) for r in rows], np.int64),
        "session": np.array([key_of(str(r["session"])) if "session" in r else 0 for r in rows], np.uint64),
        "turn": np.array([r.get("turn", 0) for r in rows], np.int64),
        "id_counts": counts,
        "ids": ids,
    }
    for name, default in defaults.items():
        batch[name] = [names.setdefault(value, value) for value in (str(r.get(name, default)) for r in rows)]
    return batch, fresh


def _offset_ns(row: dict[str, Any]) -> int:
    return round(float(row["offset_ms"]) * 1e6) if "offset_ms" in row else round(float(row["offset_s"]) * 1e9)


def _problem(row: dict[str, Any]) -> str | None:
    if ("offset_s" in row) == ("offset_ms" in row):
        return "give exactly one of offset_s and offset_ms"
    offset = row["offset_s"] if "offset_s" in row else row["offset_ms"]
    latest = MAX_OFFSET_S if "offset_s" in row else MAX_OFFSET_S * 1000
    if type(offset) not in (int, float) or not 0 <= offset <= latest:
        return f"offset {offset!r} is not a number within 0..{latest:g}"
    for name in _INTS:
        if name in row and type(row[name]) is not int:
            return f"{name} is {row[name]!r}, not an integer"
    if type(row.get("input_tokens")) is not int or row["input_tokens"] < 0:
        return "input_tokens must be a non-negative integer"
    for name, (low, high) in _RANGES.items():
        if name in row and not low <= row[name] <= high:
            return f"{name} {row[name]} is not within {low}..{high}"
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


def _block_ids(rows: list[dict[str, Any]], block: int, fresh: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Ids of every row's full blocks (flat, per-row counts): equal ids ⇔ equal segment lists up to
    the block's end. Blocks after the segments get fresh negative ids (never a name's), numbered
    from `fresh` on in row order."""
    shared: list[int] = []  # ids of blocks that end inside a segment, rows one after another
    shared_counts = np.zeros(len(rows), np.int64)
    for i, row in enumerate(rows):
        segments = row.get("prefix")
        if segments:
            segment_ids = _segment_ids(tuple(map(tuple, segments)), block)
            shared += segment_ids
            shared_counts[i] = len(segment_ids)
    counts = np.array([row["input_tokens"] for row in rows], np.int64) // block
    starts = np.cumsum(counts) - counts
    position = np.arange(int(counts.sum())) - np.repeat(starts, counts)
    is_shared = position < np.repeat(shared_counts, counts)
    ids = np.empty(len(position), np.int64)
    ids[is_shared] = shared
    tail = len(ids) - len(shared)
    ids[~is_shared] = -1 - fresh - np.arange(tail, dtype=np.int64)
    return ids, counts, fresh + tail


@functools.lru_cache(maxsize=4096)  # hand-made workloads repeat a few segment lists many times
def _segment_ids(segments: tuple[tuple[str, int], ...], block: int) -> tuple[int, ...]:
    """Ids of the blocks that end inside the segments; a shorter same-named segment is a prefix."""
    ids: list[int] = []
    done = 0  # tokens covered by the segments so far
    chain = ""  # the segments so far, so that only equal segment lists give equal ids
    for name, tokens in segments:
        key = key_of(f"{chain}\x00{name}") >> 1
        ids += (key + end - done for end in range((done // block + 1) * block, done + tokens + 1, block))
        chain = f"{key:x}:{tokens}"
        done += tokens
    return tuple(ids)


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    block = export_block(cols, options.block_size, DEFAULT_BLOCK)
    tally = ReuseTally(block)
    rows = write_json_lines(path, _rows(cols, block, tally))
    command = f"replayproxy import {path} --format jsonl --block-size {block} -o TRACE.rpt"
    return ExportResult(rows, [command], reuse=tally.reuse, block_size=block)


def _rows(cols: Columns, block: int, tally: ReuseTally) -> Iterator[dict[str, Any]]:
    """Shapes as jsonl; shared leading blocks become `[["b<id>", block], ...]` segments.

    Two passes over the re-blocked ids, a chunk of requests at a time: the first finds the ids
    used more than once, the second writes each row's leading run of them.
    """
    repeated = repeated_ids(cols, block)
    labels = SessionLabels(cols)
    origin = int(cols.offset_ns[0]) if len(cols) else 0
    first = 0
    for flat, counts in iter_block_ids(cols, block, tally=tally):
        rows = slice(first, first + len(counts))
        first += len(counts)
        seconds = ((cols.offset_ns[rows] - origin) / 1e9).round(6).tolist()
        inputs = np.maximum(cols.input_tokens[rows], 0)
        full = np.minimum(_leading_run(is_repeated(repeated, flat), counts), inputs // block).tolist()
        starts = (np.cumsum(counts) - counts).tolist()
        chunk_labels = labels.of(rows)
        columns = (
            cols.scalar["output_tokens"][rows].tolist(),
            cols.scalar["max_tokens"][rows].tolist(),
            cols.model[rows].tolist(),
            cols.endpoint[rows].tolist(),
            cols.stream[rows].tolist(),
            cols.status[rows].tolist(),
            cols.error[rows].tolist(),
            cols.turn[rows].tolist(),
        )
        for k, (out, limit, model, endpoint, stream, status, error, turn) in enumerate(
            zip(*columns, strict=True)
        ):
            row: dict[str, Any] = {"offset_s": seconds[k], "input_tokens": int(inputs[k])}
            if out >= 0:
                row["output_tokens"] = out
            if limit >= 0:
                row["max_tokens"] = limit
            row.update(model=model, endpoint=endpoint, stream=bool(stream), status=status, error=error)
            if chunk_labels[k] is not None:
                row.update(session=chunk_labels[k], turn=turn)
            if full[k]:
                lead = flat[starts[k] : starts[k] + full[k]].tolist()
                row["prefix"] = [[f"b{b}", block] for b in lead]
            yield row


def _leading_run(flags: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per row (a segment of `counts` flags), how many of its first flags are all true."""
    starts = np.cumsum(counts) - counts
    position = np.arange(len(flags)) - np.repeat(starts, counts)
    stops = np.where(flags, np.iinfo(np.int64).max, position)  # a false flag ends the run at its position
    run = np.full(len(counts), np.iinfo(np.int64).max, np.int64)
    has = counts > 0
    if has.any():
        run[has] = np.minimum.reduceat(stops, starts[has])
    limited: np.ndarray = np.minimum(run, counts)
    return limited
