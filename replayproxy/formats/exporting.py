"""What every exporter shares: the options the user states and the notes printed next to the file."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from replayproxy.trace import Columns, ragged_rows
from replayproxy.trace.columns import row_starts, take_rows
from replayproxy.trace.mapped import is_mapped, mapped_array, release_pages

# The replayer's prompt synthesis, injected by the export command (formats may not import replay):
# the prompt text of every request, in arrival order, as the replayer would send it, one at a time.
PromptsOf = Callable[[Columns], Iterable[str]]


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """Choices from the command line; None means the format's documented default."""

    block_size: int | None = None  # tokens per consumer hash id
    sessions: bool = False  # add session_id / delay (AIPerf, GenAI-Perf multi-turn)
    model: str = "MODEL"  # shown in the printed consumer command lines
    url: str = "http://localhost:8000"
    inspect: Mapping[str, object] | None = None  # `inspect --json` figures, for the profile
    prompts: PromptsOf | None = None  # the replayer's prompt synthesis, for vllm-custom


@dataclass(slots=True)
class ExportResult:
    """Rows written and lines for the user (consumer command lines, caveats)."""

    rows: int
    notes: list[str] = field(default_factory=list)
    reuse: float | None = None  # prefix reuse of the written ids (formats with ids): blocks.ReuseTally
    block_size: int | None = None  # tokens per written id


def write_json_lines(path: Path, rows: Iterable[dict[str, object]]) -> int:
    """One compact JSON object per line (orjson), newline-terminated; returns the count."""
    count = 0
    dumps = orjson.dumps
    with open(path, "wb") as out:
        for row in rows:
            out.write(dumps(row) + b"\n")
            count += 1
    return count


def relative_ms(cols: Columns, rows: slice = slice(None)) -> np.ndarray:
    """Arrival of `rows` in milliseconds from the first request, to the microsecond (float64)."""
    offsets = cols.offset_ns[rows].astype(np.int64)
    base = int(cols.offset_ns[0]) if len(cols) else 0
    return np.round((offsets - base) / 1e6, 3)


def plain_numbers(values: np.ndarray) -> list[int | float]:
    """Floats as JSON numbers, whole ones written as integers (`250`, not `250.0`: integer readers)."""
    return [int(v) if v.is_integer() else v for v in values.tolist()]


def output_lengths(cols: Columns, rows: slice = slice(None)) -> tuple[np.ndarray, int]:
    """Recorded output tokens of `rows`, else max_tokens, else 1 (never 0: consumers refuse
    max_tokens 0). Also how many rows needed a fallback.
    """
    out = cols.output_tokens[rows].astype(np.int64)
    limits = cols.max_tokens[rows]
    fallback = np.where(limits > 0, limits, 1)
    missing = out < 0
    return np.maximum(np.where(missing, fallback, out), 1), int(missing.sum())


EXPORT_ROWS = 1 << 16  # rows an export reads at a time: a mapped trace is read through, not held


def row_chunks(n: int) -> list[slice]:
    return [slice(i, i + EXPORT_ROWS) for i in range(0, n, EXPORT_ROWS)]


def missing_outputs(cols: Columns) -> int:
    """How many requests have no recorded output length (`output_lengths` falls back for them)."""
    missing = 0
    for rows in row_chunks(len(cols)):
        missing += int((cols.output_tokens[rows] < 0).sum())
        cols.release(rows)
    return missing


def failed(cols: Columns) -> np.ndarray:
    """Requests that did not succeed at the source: an error class, or an answer other than 2xx.

    Status 0 without an error class means no answer was recorded (synthesized workloads): kept.
    """
    bad = np.zeros(len(cols), bool)
    for rows in row_chunks(len(cols)):
        status = cols.status[rows].astype(np.int64)
        answered = status != 0
        bad[rows] = (cols.error[rows] != "") | (answered & ((status < 200) | (status >= 300)))
        cols.release(rows)
    return bad


def row_slice(cols: Columns, rows: slice) -> Columns:
    """Consecutive requests as their own Columns (views, no copies)."""
    first, stop = rows.start or 0, min(rows.stop, len(cols))
    hashes = slice(int(cols.prefix_index[first]), int(cols.prefix_index[stop]))
    gaps = slice(int(cols.chunk_index[first]), int(cols.chunk_index[stop]))
    joins = slice(int(cols.join_index[first]), int(cols.join_index[stop]))
    return Columns(
        headers=cols.headers,
        report=cols.report,
        scalar={name: column[first:stop] for name, column in cols.scalar.items()},
        prefix_hashes=cols.prefix_hashes[hashes],
        prefix_index=cols.prefix_index[first : stop + 1] - cols.prefix_index[first],
        chunk_gaps_us=cols.chunk_gaps_us[gaps],
        chunk_index=cols.chunk_index[first : stop + 1] - cols.chunk_index[first],
        join_ids=cols.join_ids[joins],
        join_index=cols.join_index[first : stop + 1] - cols.join_index[first],
    )


def select_rows(cols: Columns, rows: np.ndarray) -> Columns:
    """The requests at `rows` (sorted indices) as their own Columns."""
    hashes, hash_index = _take_ragged(cols.prefix_hashes, cols.prefix_index, rows)
    gaps, gap_index = _take_ragged(cols.chunk_gaps_us, cols.chunk_index, rows)
    joins, join_index = _take_ragged(cols.join_ids, cols.join_index, rows)
    return Columns(
        headers=cols.headers,
        report=cols.report,
        scalar={name: take_rows(column, rows) for name, column in cols.scalar.items()},
        prefix_hashes=hashes,
        prefix_index=hash_index,
        chunk_gaps_us=gaps,
        chunk_index=gap_index,
        join_ids=joins,
        join_index=join_index,
    )


TAKEN_ROWS = 1 << 16  # rows of a mapped ragged column copied at a time


def _take_ragged(flat: np.ndarray, index: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The `rows` of a ragged column and their index; a mapped column's rows go to a new map, a
    chunk of rows at a time (a trace's hashes are never all in memory)."""
    if not is_mapped(flat) and not is_mapped(index):
        lengths = np.diff(index)[rows]
        return ragged_rows(flat, index, rows)[0], np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    new_index = row_starts(mapped_array(_released_after(_lengths(index, rows), index), np.int64))
    chunks = (ragged_rows(flat, index, rows[i : i + TAKEN_ROWS])[0] for i in range(0, len(rows), TAKEN_ROWS))
    return mapped_array(_released_after(chunks, flat, index), flat.dtype), new_index


def _lengths(index: np.ndarray, rows: np.ndarray) -> Iterator[np.ndarray]:
    """The lengths of `rows` of a ragged column, a chunk of rows at a time."""
    for i in range(0, len(rows), TAKEN_ROWS):
        taken = rows[i : i + TAKEN_ROWS]
        yield index[taken + 1] - index[taken]


def _released_after(chunks: Iterator[np.ndarray], *sources: np.ndarray) -> Iterator[np.ndarray]:
    for chunk in chunks:
        yield chunk
        for source in sources:
            release_pages(source)


class SessionLabels:
    """Sessions as short labels in first-seen order ("s0", "s1", ...): keyed hashes never leave.
    Asked for consecutive row ranges in order; holds one entry per session, not per request."""

    def __init__(self, cols: Columns) -> None:
        self._sessions = cols.session
        self._names: dict[int, str] = {}

    def of(self, rows: slice) -> list[str | None]:
        names = self._names
        return [names.setdefault(s, f"s{len(names)}") if s else None for s in self._sessions[rows].tolist()]


def aiperf_command(path: Path, dataset_type: str, block: int, options: ExportOptions) -> str:
    """AIPerf trace replay (docs: benchmark-modes/trace-replay; --isl-block-size sets the id size).

    `ignore_eos:true` makes each request generate its recorded output length; without it the
    engine stops at its own end-of-sequence token and the workload shrinks.
    """
    args = [
        f"aiperf profile --model {options.model} --url {options.url} --endpoint-type chat --streaming",
        f"--input-file {path} --custom-dataset-type {dataset_type} --isl-block-size {block} --fixed-schedule",
        "--extra-inputs ignore_eos:true",
    ]
    return "AIPerf:   " + " ".join(args)


def vllm_timed_trace_command(
    path: Path, rows: int, block: int, seconds_per_unit: float, options: ExportOptions
) -> str:
    """vLLM `timed_trace` (PR #39795): ids expand to the chunk size; timestamps times the multiplier.

    The dataset passes token-id prompts, which only a completions backend accepts.
    """
    args = [
        f"vllm bench serve --backend openai --endpoint /v1/completions --base-url {options.url}",
        f"--model {options.model} --dataset-name timed_trace --dataset-path {path} --num-prompts {rows}",
        f"--timed-trace-chunk-hash-size {block} --timed-trace-sec-multiplier {seconds_per_unit:g}",
        "--self-timed --disable-shuffle --ignore-eos",
    ]
    return "vLLM:     " + " ".join(args)
