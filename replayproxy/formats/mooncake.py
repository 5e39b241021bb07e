"""Mooncake FAST'25 JSON lines, the lingua franca of trace replay (AIPerf, guidellm, vLLM, SGLang...).

`{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}` per request; hash ids
stand for `block_size`-token blocks (512 in the published traces) and obey
`len(hash_ids) == ceil(input_length / block_size)`. AIPerf/GenAI-Perf add `session_id` and `delay`
for multi-turn sessions: a later turn's row holds only its new part (the reader appends the earlier
turns and their replies itself) and `delay` is the time after the previous turn's reply ended.
Consumers' readers and rules are cited in docs/formats.md.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.formats.blocks import ReuseTally, export_block, iter_row_ids
from replayproxy.formats.chained_hashes import ChainedHashes
from replayproxy.formats.exporting import (
    ExportOptions,
    ExportResult,
    SessionLabels,
    aiperf_command,
    missing_outputs,
    output_lengths,
    plain_numbers,
    relative_ms,
    vllm_timed_trace_command,
    write_json_lines,
)
from replayproxy.formats.importing import (
    BadLines,
    Imported,
    ImportOptions,
    SpilledColumns,
    TurnsInArrival,
    drop_rows,
    flatten_ids,
    iter_json_lines,
    keep_good,
    key_of,
    paused_gc,
    unit_warnings,
)
from replayproxy.shape import MAX_OFFSET_S, MAX_TOKENS
from replayproxy.trace import Columns

DEFAULT_BLOCK = 512
SGLANG_CHUNK = 128  # tokens SGLang's Mooncake reader writes per hash id ("hi" × 128)
UNIT_NS = {"ms": 1_000_000, "s": 1_000_000_000}
_NUMBER = (int, float)
# timestamps, input lengths, output lengths, flat hash ids, ids per row
RowColumns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
_INT_COLUMNS = ("offset_ns", "inputs", "outputs", "think_ns")  # kept per request while reading


# --------------------------------------------------------------------------- import


def read(path: Path, options: ImportOptions) -> Imported:
    """Parse a Mooncake-style file; timestamps in `options.time_unit` (default ms)."""
    with paused_gc():  # a million dicts alive make every cycle collection a full, useless walk
        return _read(path, options)


def _read(path: Path, options: ImportOptions) -> Imported:
    block = options.block_size or DEFAULT_BLOCK
    unit = options.time_unit or "ms"
    unit_ns = UNIT_NS[unit]
    bad = BadLines(str(path), options.skip_bad)
    hashes = ChainedHashes(block)
    turns = _SessionTurns()
    spilled = SpilledColumns(raw=np.float64, session=np.uint64, **dict.fromkeys(_INT_COLUMNS, np.int64))
    with_sessions = False
    for rows, line_nos in iter_json_lines(path, bad):
        ts, inputs, outputs, ids, counts, sessions, delays = _batch(rows, line_nos, block, bad, unit_ns)
        if sessions.any():
            ts, inputs = turns.follow(ts, sessions, delays, inputs, outputs)
            with_sessions = True
        hashes.add(ids, counts, inputs)
        think_ns = np.where(np.isnan(delays), -1, np.rint(np.nan_to_num(delays) * unit_ns))
        spilled.add(
            raw=ts, offset_ns=np.rint(ts * unit_ns).astype(np.int64), inputs=inputs, outputs=outputs,
            session=sessions, think_ns=think_ns.astype(np.int64),
        )  # fmt: skip
    columns = spilled.result()
    extra_columns: dict[str, Any] = {}
    if with_sessions:
        sessions = columns["session"]
        extra_columns.update(session=sessions, turn=TurnsInArrival(sessions), think_ns=columns["think_ns"])
    if options.model:
        extra_columns["model"] = options.model
    return Imported(
        source="mooncake",
        offset_ns=columns["offset_ns"],
        input_tokens=columns["inputs"],
        output_tokens=columns["outputs"],
        bad=bad,
        block_size=block,
        hashes=hashes,
        columns=extra_columns,
        extra={"time_unit": unit},
        warnings=unit_warnings(columns["raw"], unit, str(path)),
    )


def _batch(
    rows: list[dict[str, Any]], line_nos: Sequence[int], block: int, bad: BadLines, unit_ns: int
) -> list[np.ndarray]:
    """One batch of lines as arrays: row_columns of its valid rows, their session keys (0: none)
    and delays (NaN: none); no row's dict outlives its batch."""
    try:
        columns = row_columns(rows)
    except (KeyError, TypeError, ValueError, OverflowError):
        rows, line_nos = keep_good(rows, line_nos, row_problem, bad)
        columns = row_columns(rows)
    rows, columns = valid_rows(rows, columns, line_nos, block, bad, unit_ns)
    sessions = np.zeros(len(rows), np.uint64)
    delays = np.full(len(rows), math.nan)
    if any("session_id" in row for row in rows):
        sessions = np.array(
            [key_of(str(r["session_id"])) if "session_id" in r else 0 for r in rows], np.uint64
        )
        delays = np.array([float(r.get("delay", math.nan)) for r in rows], np.float64)
    return [*columns, sessions, delays]


def row_columns(rows: list[dict[str, Any]]) -> RowColumns:
    """Vectorized conversion; raises on any row a fast path cannot take (the slow path then reports it)."""
    ts = _field(rows, "timestamp", math.nan)
    if np.isnan(ts).any() and not all("timestamp" in r or ("delay" in r and "session_id" in r) for r in rows):
        raise KeyError("timestamp")
    inputs = _field(rows, "input_length", None, int)
    outputs = _field(rows, "output_length", -1, int)
    if any("delay" in r for r in rows):  # read by _batch: refused here, so the slow path names it
        delays = _field(rows, "delay", 0.0)
        if not np.all((delays >= 0) & (delays <= _LATEST_MS)):
            raise ValueError("delay")
    lists = _values(rows, "hash_ids", ())
    if not set(map(type, lists)) <= {list, tuple}:
        raise TypeError("hash_ids")
    if not set(map(type, itertools.chain.from_iterable(lists))) <= {int}:  # true and 1.7 are not ids
        raise TypeError("hash_ids")
    ids, counts = flatten_ids(lists)
    return ts, inputs, outputs, ids, counts


def _values(rows: list[dict[str, Any]], name: str, default: Any) -> list[Any]:
    try:
        return list(map(operator.itemgetter(name), rows))  # C speed when every row has the field
    except KeyError:
        if default is None:
            raise
        return [row.get(name, default) for row in rows]


def _field(rows: list[dict[str, Any]], name: str, default: Any, kind: type = float) -> np.ndarray:
    """One numeric field of every row (TypeError for a value of another type; bool is not a number)."""
    values = _values(rows, name, default)
    allowed = {int} if kind is int else {int, float}
    if not set(map(type, values)) <= allowed:
        raise TypeError(name)
    return np.array(values, np.int64 if kind is int else np.float64)


def row_problem(row: dict[str, Any]) -> str | None:
    """Why one row cannot be read (the slow path; value rules are checked vectorized after)."""
    if "input_length" not in row:
        return "no input_length (rows with only text_input or messages carry text and are not imported)"
    if "timestamp" not in row and not ("delay" in row and "session_id" in row):
        return "no timestamp (and no delay within a session)"
    for name in ("timestamp", "delay"):
        if name in row and type(row[name]) not in _NUMBER:
            return f"{name} is {row[name]!r}, not a number"
    if not 0 <= row.get("delay", 0) <= _LATEST_MS:
        return f"delay {row['delay']} is not within 0..{_LATEST_MS:g}"
    for name in ("input_length", "output_length"):
        if name in row and type(row[name]) is not int:
            return f"{name} is {row[name]!r}, not an integer"
        if name in row and abs(row[name]) > MAX_TOKENS:
            return f"{name} {row[name]} is past the {MAX_TOKENS} tokens a request can have"
    ids = row.get("hash_ids", [])
    if not isinstance(ids, list) or any(type(i) is not int for i in ids):
        return "hash_ids is not a list of integers"
    if any(abs(i) >= _ID_LIMIT for i in ids):
        return f"a hash id is out of range (|id| < 2**63, got {max(ids, key=abs)})"
    return None


_ID_LIMIT = 1 << 63
_LATEST_MS = MAX_OFFSET_S * 1000  # the latest time taken in milliseconds (a bound in seconds too)


def valid_rows(
    rows: list[dict[str, Any]],
    columns: RowColumns,
    line_nos: Sequence[int],
    block: int,
    bad: BadLines,
    unit_ns: int = UNIT_NS["ms"],
) -> tuple[list[dict[str, Any]], RowColumns]:
    """Rows keeping the value rules (the others are reported to `bad`) and their `row_columns`."""
    keep = drop_rows(*value_problems(*columns, block, MAX_OFFSET_S * 1e9 / unit_ns), line_nos, bad)
    if len(keep) == len(rows):
        return rows, columns
    rows = [rows[i] for i in keep]
    return rows, row_columns(rows)


def value_problems(
    ts: np.ndarray,
    inputs: np.ndarray,
    outputs: np.ndarray,
    ids: np.ndarray,
    counts: np.ndarray,
    block: int,
    latest: float,
) -> tuple[np.ndarray, Any]:
    """Rows breaking the format's value rules, and a function describing row i's problem;
    `latest` is the largest timestamp taken (MAX_OFFSET_S in the file's unit)."""
    expected = -(-inputs // block)
    negative_id = np.zeros(len(inputs), bool)
    if len(ids) and ids.min() < 0:
        negative_id[np.repeat(np.arange(len(counts)), counts)[ids < 0]] = True
    wrong_count = (counts > 0) & (counts != expected)
    too_late = (ts > latest) | np.isinf(ts)
    too_long = (inputs > MAX_TOKENS) | (outputs > MAX_TOKENS)
    mask = (inputs < 0) | (outputs < -1) | too_long | (ts < 0) | too_late | negative_id | wrong_count

    def reason(i: int) -> str:
        if too_long[i]:
            return f"input_length {inputs[i]} or output_length {outputs[i]} is past {MAX_TOKENS} tokens"
        if too_late[i]:
            return f"timestamp {ts[i]} is past {latest:g}, the latest taken ({MAX_OFFSET_S:g} s)"
        if wrong_count[i]:
            return (
                f"{counts[i]} hash_ids for input_length {inputs[i]}, expected ceil({inputs[i]}/{block}) = "
                f"{expected[i]} (is the block size {block}? see --block-size)"
            )
        if negative_id[i]:
            return "negative hash id"
        return f"negative value (timestamp {ts[i]}, input_length {inputs[i]}, output_length {outputs[i]})"

    return mask, reason


class _SessionTurns:
    """Later turns of a session as AIPerf reads them: the whole prompt is the previous prompt, its
    reply and this row's new part; `delay` (NaN: none) is the think time after the previous reply
    ended. Its arrival is taken as the previous arrival + delay (the reply's duration is not in the
    file: a lower bound; closed-loop replay uses the think time). Rows in file order, as AIPerf
    takes them, a batch at a time: only each session's latest turn is kept between batches."""

    def __init__(self) -> None:
        self.latest: dict[int, tuple[float, int, int]] = {}  # session -> its latest turn's (ts, in, out)

    def follow(
        self,
        ts: np.ndarray,
        sessions: np.ndarray,
        delays: np.ndarray,
        inputs: np.ndarray,
        outputs: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The batch's arrival times and whole-prompt input lengths."""
        ts, inputs = ts.copy(), inputs.copy()
        latest = self.latest
        for i, (session, delay) in enumerate(zip(sessions.tolist(), delays.tolist(), strict=True)):
            previous = latest.get(session) if session else None
            if previous is not None:
                inputs[i] += previous[1] + max(previous[2], 0)
            if math.isnan(ts[i]):
                ts[i] = (previous[0] if previous is not None else 0.0) + (0.0 if math.isnan(delay) else delay)
            if session:
                latest[session] = (float(ts[i]), int(inputs[i]), int(outputs[i]))
        return ts, inputs


# --------------------------------------------------------------------------- export


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    """Write Mooncake JSON lines re-blocked to `--block-size` (default: the trace's block size, else
    512 as in the published traces) and print consumer commands."""
    block = export_block(cols, options.block_size, DEFAULT_BLOCK)
    tally = ReuseTally(block)
    rows = write_json_lines(path, mooncake_rows(cols, block, options.sessions, tally))
    result = ExportResult(rows, reuse=tally.reuse, block_size=block)
    missing = missing_outputs(cols)
    if missing:
        result.notes.append(
            f"{missing} requests had no recorded output length: output_length = max_tokens or 1"
        )
    result.notes += consumer_commands(path, block, rows, options)
    result.notes.append(
        f"replayproxy: replayproxy import {path} --format mooncake --block-size {block} -o TRACE.rpt"
    )
    return result


def mooncake_rows(
    cols: Columns, block: int, sessions: bool = False, tally: ReuseTally | None = None
) -> Iterator[dict[str, Any]]:
    """The rows in arrival order; with `sessions`, a later turn carries `session_id` and `delay`
    and only its new part: its input beyond the previous prompt and reply, as its last ids.

    Rows are built a chunk of requests at a time, so memory does not grow with the trace.
    Timestamps keep microseconds (AIPerf and SGLang read fractional milliseconds).
    """
    labels = SessionLabels(cols) if sessions else None
    turns = _LaterTurns(cols)
    for rows, row_ids in iter_row_ids(cols, block, tally):
        n_ins = np.maximum(cols.input_tokens[rows], 0).tolist()
        n_outs = output_lengths(cols, rows)[0].tolist()
        blank: list[None] = [None] * len(row_ids)
        chunk = zip(
            plain_numbers(relative_ms(cols, rows)),
            n_ins,
            n_outs,
            labels.of(rows) if labels is not None else blank,
            turns.of(rows, n_ins, n_outs) if sessions else blank,
            row_ids,
            strict=True,
        )
        for timestamp, n_in, n_out, label, turn, ids in chunk:
            row: dict[str, Any] = {"timestamp": timestamp}
            if label is not None:
                row["session_id"] = label
                if turn is not None:
                    delay, n_in = turn
                    row = {"session_id": label, "delay": delay}
                    ids = ids[len(ids) + (n_in // -block) :]  # the last ceil(new / block) ids
            row.update(input_length=n_in, output_length=n_out, hash_ids=ids)
            yield row


class _LaterTurns:
    """(delay ms, new input tokens) of each turn after a session's first: the delay is the recorded
    think time, else the gap from the previous turn's arrival + E2E to this arrival. Asked for
    consecutive row ranges in order; what it keeps per session is its latest turn's figures."""

    def __init__(self, cols: Columns) -> None:
        self._cols = cols
        self._previous: dict[int, tuple[int, int, int, int]] = {}  # session -> offset, e2e, in, out

    def of(self, rows: slice, inputs: list[int], outputs: list[int]) -> list[tuple[int, int] | None]:
        cols, previous = self._cols, self._previous
        found: list[tuple[int, int] | None] = []
        chunk = zip(
            cols.session[rows].tolist(),
            cols.think_ns[rows].tolist(),
            cols.offset_ns[rows].tolist(),
            cols.e2e_ns[rows].tolist(),
            inputs,
            outputs,
            strict=True,
        )
        for session, think, offset, e2e, n_in, n_out in chunk:
            before = previous.get(session) if session else None
            if before is None:
                found.append(None)
            else:
                gap = think if think >= 0 else offset - before[0] - max(before[1], 0)
                found.append((round(max(gap, 0) / 1e6), max(1, n_in - before[2] - before[3])))
            if session:
                previous[session] = (offset, e2e, n_in, n_out)
        return found


def consumer_commands(path: Path, block: int, rows: int, options: ExportOptions) -> list[str]:
    """How each tool replays this file (flags checked against their sources; see docs/formats.md).
    A file with sessions is for AIPerf alone: the others read neither `session_id` nor `delay`."""
    if options.sessions:
        return [
            aiperf_command(path, "mooncake_trace", block, options),
            "(guidellm, vLLM and SGLang do not read session_id / delay: export without --sessions for them)",
        ]
    guidellm = [
        f"guidellm run --backend kind=openai_http,target={options.url} --profile kind=replay",
        f"--data kind=mooncake,source.kind=json_file,source.path={path},"
        f"hash_id_block_size={block},time_scale=0.001",
    ]
    return [
        aiperf_command(path, "mooncake_trace", block, options),
        "guidellm: " + " ".join(guidellm),
        vllm_timed_trace_command(path, rows, block, 0.001, options),
        sglang_command(path, block, rows, options),
    ]


def sglang_command(path: Path, block: int, rows: int, options: ExportOptions) -> str:
    """SGLang's reader (python/sglang/benchmark/datasets/mooncake.py) ignores `input_length` and
    writes each hash id as the id followed by 128 × "hi": prompts have the recorded length only when
    the ids stand for 128-token blocks, so other block sizes get the export command instead."""
    if block != SGLANG_CHUNK:
        return (
            f"SGLang:   needs --block-size {SGLANG_CHUNK} (its reader makes every hash id {SGLANG_CHUNK} "
            f"tokens and ignores input_length; with {block}-token ids prompts would be "
            f"{SGLANG_CHUNK / block:g}x the recorded length): replayproxy export TRACE --format mooncake "
            f"--block-size {SGLANG_CHUNK} -o FILE"
        )
    args = [
        f"python -m sglang.bench_serving --backend sglang --base-url {options.url} --model {options.model}",
        f"--dataset-name mooncake --dataset-path {path} --num-prompts {rows} --use-trace-timestamps",
        "--mooncake-slowdown-factor 1 --mooncake-num-rounds 1",
    ]
    return (
        "SGLang:   "
        + " ".join(args)
        + f"  (prompts: {SGLANG_CHUNK} tokens and the id's digits per hash id, in the chat template)"
    )
