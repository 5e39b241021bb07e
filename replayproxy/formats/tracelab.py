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

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.formats.importing import (
    BadLines,
    Imported,
    ImportOptions,
    flatten_ids,
    keep_good,
    key_of,
    read_json_lines,
    turns_of,
)

DEFAULT_BLOCK = 64  # AIPerf's TraceLab default: the corpus has no hashes, so any size reproduces its split
INPUT_EVENTS = frozenset({"user_message", "tool_result"})
OUTPUT_EVENTS = frozenset({"text", "reasoning", "tool_call"})


def read(path: Path, options: ImportOptions) -> Imported:
    block = options.block_size or DEFAULT_BLOCK
    bad = BadLines(str(path), options.skip_bad)
    rows, line_nos = read_json_lines(path, bad)
    rows, line_nos = keep_good(rows, line_nos, _problem, bad)
    timed = [(*_timing(row), row) for row in rows]
    order = sorted(range(len(timed)), key=lambda i: (timed[i][0], timed[i][2].get("round_index") or 0))
    timed = [timed[i] for i in order]
    sessions = np.array([key_of(str(row["session_id"])) for _, _, row in timed], np.uint64)
    ids, counts = flatten_ids(list(_hash_chains(timed, block)))
    inputs = np.array([int(row["input_tokens_total"]) for _, _, row in timed], np.int64)
    outputs = np.array(
        [
            int(row.get("output_tokens") or 0) + int(row.get("reasoning_output_tokens") or 0)
            for _, _, row in timed
        ],
        np.int64,
    )
    return Imported(
        source="tracelab",
        offset_ns=np.array([round(t * 1e9) for t, _, _ in timed], np.int64),
        input_tokens=inputs,
        output_tokens=outputs,
        bad=bad,
        block_size=block,
        ids=ids,
        id_counts=counts,
        wall_clock=True,
        columns={
            "session": sessions,
            "turn": turns_of(sessions),
            "e2e_ns": np.array([-1 if api is None else round(api * 1e9) for _, api, _ in timed], np.int64),
            "model": options.model or [str(row.get("model") or "") for _, _, row in timed],
        },
    )


def _problem(row: dict[str, Any]) -> str | None:
    if not isinstance(row.get("session_id"), str | int) or isinstance(row.get("session_id"), bool):
        return "no session_id"
    for name in ("input_tokens_total", "prefix_tokens", "output_tokens", "reasoning_output_tokens"):
        value = row.get(name)
        if name == "input_tokens_total" or value is not None:
            if type(value) is not int or value < 0:
                return f"{name} is {value!r}, not a non-negative integer"
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


def _hash_chains(timed: list[tuple[float, float | None, dict[str, Any]]], block: int) -> Iterator[list[int]]:
    """Per round, ids of its full blocks: the cached prefix continues the session's previous round."""
    previous: dict[str, list[int]] = {}
    fresh = 0
    for _, _, row in timed:
        session = str(row["session_id"])
        total = int(row["input_tokens_total"])
        cached = min(int(row.get("prefix_tokens") or 0), total)
        before = previous.get(session, [])
        reuse = min(cached // block, len(before), total // block)
        ids = before[:reuse] + list(range(fresh, fresh + total // block - reuse))
        fresh += total // block - reuse
        previous[session] = ids
        yield ids
