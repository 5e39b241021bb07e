"""TraceLab agentic-coding traces (uw-syfi corpus): one JSON line per LLM round of an agent session.

A row carries `session_id`, `round_index`, `model`, `input_tokens_total` (= `prefix_tokens` +
`newly_append_tokens`, the engine-reported split of what was already cached), `output_tokens`
(plus `reasoning_output_tokens`), and `timing_events` (`user_message` / `tool_result` inputs,
`text` / `reasoning` / `tool_call` outputs, ISO-8601 times). Read as AIPerf's TraceLab loader
does (aiperf/dataset/loader/_tracelab_convert.py): a round is sent at its latest input event, it
runs until its last output event (kept as the production E2E, so the gap to the next round — the
tool wait or the human — is the session's think time), and its prefix keeps the first
`prefix_tokens // block` blocks of the session's previous round, fresh blocks after.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.formats.chained_hashes import ChainedHashes
from replayproxy.formats.importing import (
    BadLines,
    Coded,
    Imported,
    ImportOptions,
    SpilledColumns,
    TurnsInArrival,
    chunks,
    iter_json_lines,
    keep_good,
    key_of,
    sorted_columns,
)
from replayproxy.shape import MAX_TOKENS
from replayproxy.trace.mapped import mapped_array, release_pages

DEFAULT_BLOCK = 64  # AIPerf's TraceLab default: the corpus has no hashes, so any size reproduces its split
INPUT_EVENTS = frozenset({"user_message", "tool_result"})
OUTPUT_EVENTS = frozenset({"text", "reasoning", "tool_call"})


_PARTS = {
    "sent": np.float64, "run": np.float64, "round": np.float64, "session": np.uint64,
    "total": np.int64, "cached": np.int64, "outputs": np.int64,
}  # fmt: skip
CHAIN_IDS = 1 << 20  # block ids built and chained at a time (agent prompts run to thousands of blocks)
CHAIN_ROWS = 1 << 16  # and at most this many rounds


def read(path: Path, options: ImportOptions) -> Imported:
    """Rounds a batch of lines at a time, kept as numbers; ordered by send time once all are read,
    then chained session by session (each session's latest round kept as runs of ids)."""
    block = options.block_size or DEFAULT_BLOCK
    bad = BadLines(str(path), options.skip_bad)
    spilled = SpilledColumns(**_PARTS)
    for rows, line_nos in iter_json_lines(path, bad):
        rows, _ = keep_good(rows, line_nos, _problem, bad)
        spilled.add(**_numbers(rows))
        if not options.model:
            spilled.add_strings("model", (str(row.get("model") or "") for row in rows))
    parts = spilled.result()
    order = np.lexsort((parts["round"], parts["sent"]))  # stable: by send time, then round, then file order
    del parts["round"]
    models = parts.pop("model", None)
    ordered = sorted_columns(parts, order)
    if isinstance(models, Coded):
        models = Coded(models.table, sorted_columns({"codes": models.codes}, order)["codes"])
    del order
    sessions, totals = ordered["session"], ordered["total"]
    hashes = ChainedHashes(block)
    _chain_rounds(hashes, sessions, totals, ordered["cached"], block)
    return Imported(
        source="tracelab",
        offset_ns=mapped_array(map(_sent_ns, chunks(ordered["sent"])), np.int64),
        input_tokens=totals,
        output_tokens=ordered["outputs"],
        bad=bad,
        block_size=block,
        hashes=hashes,
        wall_clock=True,
        columns={
            "session": sessions,
            "turn": TurnsInArrival(sessions),
            "e2e_ns": mapped_array(map(_run_ns, chunks(ordered["run"])), np.int64),
            "model": options.model or models,
        },
    )


def _sent_ns(sent: np.ndarray) -> np.ndarray:
    ns: np.ndarray = np.rint(sent * 1e9).astype(np.int64)
    return ns


def _run_ns(run: np.ndarray) -> np.ndarray:
    """Run times in nanoseconds, -1 where unknown."""
    ns: np.ndarray = np.where(np.isnan(run), -1, np.rint(np.nan_to_num(run) * 1e9)).astype(np.int64)
    return ns


def _numbers(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """A batch of checked rounds as the numbers the import keeps (no row outlives its batch)."""
    timing = [_timing(row) for row in rows]
    totals = [int(row["input_tokens_total"]) for row in rows]
    return {
        "sent": np.array([sent for sent, _ in timing], np.float64),
        "run": np.array([math.nan if run is None else run for _, run in timing], np.float64),
        "round": np.array([row.get("round_index") or 0 for row in rows], np.float64),
        "session": np.array([key_of(str(row["session_id"])) for row in rows], np.uint64),
        "total": np.array(totals, np.int64),
        "cached": np.array(
            [min(int(row.get("prefix_tokens") or 0), total) for row, total in zip(rows, totals, strict=True)],
            np.int64,
        ),
        "outputs": np.array(
            [int(r.get("output_tokens") or 0) + int(r.get("reasoning_output_tokens") or 0) for r in rows],
            np.int64,
        ),
    }


def _problem(row: dict[str, Any]) -> str | None:
    if not isinstance(row.get("session_id"), str | int) or isinstance(row.get("session_id"), bool):
        return "no session_id"
    if not isinstance(row.get("round_index") or 0, int | float):
        return f"round_index is {row['round_index']!r}, not a number"
    for name in ("input_tokens_total", "prefix_tokens", "output_tokens", "reasoning_output_tokens"):
        value = row.get(name)
        if name == "input_tokens_total" or value is not None:
            if type(value) is not int or not 0 <= value <= MAX_TOKENS:
                return f"{name} is {value!r}, not an integer within 0..{MAX_TOKENS}"
    events = row.get("timing_events")
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        return "timing_events is not a list of events"
    try:
        times = [_seconds(e["timestamp"]) for e in events if e.get("timestamp")]
    except (TypeError, ValueError, AttributeError):
        return "a timing event's timestamp is not an ISO-8601 date-time"
    return None if times else "no timed event (the round's send time is unknown)"


def _seconds(text: str) -> float:
    """ISO-8601 → POSIX seconds; a time without a zone is UTC."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _timing(row: dict[str, Any]) -> tuple[float, float | None]:
    """(send time, run time): the latest input event, and from there to the last output event."""
    events = [e for e in row["timing_events"] if e.get("timestamp")]
    ins = [_seconds(e["timestamp"]) for e in events if e.get("event_type") in INPUT_EVENTS]
    outs = [_seconds(e["timestamp"]) for e in events if e.get("event_type") in OUTPUT_EVENTS]
    sent = max(ins) if ins else min(outs) if outs else min(_seconds(e["timestamp"]) for e in events)
    return sent, (max(max(outs) - sent, 0.0) if outs else None)


def _chain_rounds(
    hashes: ChainedHashes, sessions: np.ndarray, totals: np.ndarray, cached: np.ndarray, block: int
) -> None:
    """Per round (in send order), ids of its full blocks: the cached prefix continues the session's
    previous round, fresh ids follow. A round's ids are runs of consecutive ids, so each session's
    latest round is kept as a few (first id, count) runs, not as its ids."""
    latest: dict[int, tuple[list[tuple[int, int]], int]] = {}  # session -> (runs, ids in them)
    fresh = 0
    firsts: list[int] = []
    lengths: list[int] = []
    counts: list[int] = []
    done = 0  # rounds chained so far
    pending = 0  # ids of the rounds not chained yet
    for i, session, total, cache in _rounds(sessions, totals, cached):
        full = total // block
        before, known = latest.get(session, ([], 0))
        reuse = min(cache // block, known, full)
        runs = _first_ids(before, reuse)
        if full > reuse:
            runs.append((fresh, full - reuse))
            fresh += full - reuse
        latest[session] = (runs, full)
        firsts += [first for first, _ in runs]
        lengths += [n for _, n in runs]
        counts.append(full)
        pending += full
        if pending >= CHAIN_IDS or len(counts) >= CHAIN_ROWS or i == len(sessions) - 1:
            ids = _expand(np.array(firsts, np.int64), np.array(lengths, np.int64))
            hashes.add(ids, np.array(counts, np.int64), totals[done : i + 1])
            done = i + 1
            firsts, lengths, counts, pending = [], [], [], 0


def _rounds(
    sessions: np.ndarray, totals: np.ndarray, cached: np.ndarray
) -> Iterator[tuple[int, int, int, int]]:
    """(row, session, input tokens, cached tokens), as Python numbers a slice of rows at a time."""
    for lo in range(0, len(sessions), CHAIN_ROWS):
        part = slice(lo, lo + CHAIN_ROWS)
        yield from zip(
            itertools.count(lo), sessions[part].tolist(), totals[part].tolist(), cached[part].tolist()
        )
        for column in (sessions, totals, cached):
            release_pages(column[part])


def _first_ids(runs: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    """The runs holding the first `n` ids of `runs`."""
    kept: list[tuple[int, int]] = []
    for first, length in runs:
        if n <= 0:
            break
        kept.append((first, min(length, n)))
        n -= length
    return kept


def _expand(firsts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Runs of consecutive ids as one flat array."""
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    ids: np.ndarray = np.repeat(firsts - (ends - lengths), lengths) + np.arange(total)
    return ids
