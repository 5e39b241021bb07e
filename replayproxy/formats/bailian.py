"""Alibaba Qwen-Bailian usage traces (qwen-bailian-usagetraces-anon, ATC'25), read and written.

One JSON object per request: `chat_id`, `parent_chat_id` (-1 = root), `timestamp` (seconds, float),
`input_length`, `output_length`, `type` (text|search|image|file), `turn` (1-based), `hash_ids`
(16-token blocks). A follow-up's input_length and hash_ids already cover the whole conversation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.formats import mooncake
from replayproxy.formats.blocks import iter_row_ids
from replayproxy.formats.exporting import (
    ExportOptions,
    ExportResult,
    aiperf_command,
    output_lengths,
    vllm_timed_trace_command,
    write_json_lines,
)
from replayproxy.formats.importing import (
    BadLines,
    Imported,
    ImportOptions,
    keep_good,
    read_json_lines,
    unit_warnings,
)
from replayproxy.shape import REQUEST_TYPES
from replayproxy.trace import Columns

DEFAULT_BLOCK = 16


def read(path: Path, options: ImportOptions) -> Imported:
    """Parse a Bailian file: sessions follow parent_chat_id links to their root chat."""
    bad = BadLines(str(path), options.skip_bad)
    rows, line_nos = read_json_lines(path, bad)
    rows, line_nos = keep_good(rows, line_nos, _problem, bad)
    block = options.block_size or DEFAULT_BLOCK
    columns = mooncake.row_columns(rows)
    rows, (ts, inputs, outputs, ids, counts) = mooncake.valid_rows(rows, columns, line_nos, block, bad)
    sessions = _root_sessions(rows)
    unit = options.time_unit or "s"
    types = [_request_type(r.get("type")) for r in rows]
    return Imported(
        source="bailian",
        offset_ns=np.rint(ts * mooncake.UNIT_NS[unit]).astype(np.int64),
        input_tokens=inputs,
        output_tokens=outputs,
        bad=bad,
        block_size=block,
        ids=ids,
        id_counts=counts,
        columns={
            "session": sessions,
            "turn": np.array([max(int(r["turn"]) - 1, 0) for r in rows], np.int64),
            "request_type": types,
            **({"model": options.model} if options.model else {}),
        },
        extra={"request_types": sorted(set(types)), "time_unit": unit},
        warnings=unit_warnings(ts, unit, str(path)),
    )


_TYPES: dict[str, str] = {name: name for name in REQUEST_TYPES if name}


def _request_type(value: Any) -> str:
    """The published types (text, search, image, file) as they are; anything else is "other", so no
    text a file puts in the field reaches the trace; a row without the field is "" (not recorded)."""
    if value is None:
        return ""
    return _TYPES.get(value, "other") if isinstance(value, str) else "other"


def _problem(row: dict[str, Any]) -> str | None:
    for name in ("chat_id", "parent_chat_id", "turn"):
        if type(row.get(name)) is not int:
            return f"{name} is {row.get(name)!r}, not an integer"
    if "timestamp" not in row or "output_length" not in row:
        return "no timestamp" if "timestamp" not in row else "no output_length"
    return mooncake.row_problem(row)


def _root_sessions(rows: list[dict[str, Any]]) -> np.ndarray:
    """Session = the root chat reached through parent links (chats without follow-ups get none)."""
    parent = {r["chat_id"]: r["parent_chat_id"] for r in rows}
    has_children = {p for p in parent.values() if p != -1}
    roots: list[int] = []
    for r in rows:
        chat, seen = r["chat_id"], set()
        while parent.get(chat, -1) != -1 and parent[chat] in parent and chat not in seen:
            seen.add(chat)
            chat = parent[chat]
        linked = r["parent_chat_id"] != -1 or r["chat_id"] in has_children
        roots.append(int(chat) + 1 if linked else 0)  # +1: chat 0 must not read as "no session"
    return np.array(roots, np.uint64)


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    """Bailian rows re-blocked to `--block-size` (default 16); chat ids number requests in arrival order."""
    block = options.block_size or DEFAULT_BLOCK
    rows = write_json_lines(path, _rows(cols, block))
    notes = [vllm_timed_trace_command(path, rows, block, 1.0, options)]
    if np.any((cols.session != 0) & (cols.turn > 0)):
        # AIPerf reads a linked turn as a delta and appends the earlier turns and replies itself,
        # while a Bailian row holds the whole conversation: its prompts would grow twice.
        notes.append("AIPerf: not for this file (multi-turn); export --format mooncake --sessions for AIPerf")
    else:
        notes.insert(0, aiperf_command(path, "bailian_trace", block, options))
    return ExportResult(rows, notes)


def _rows(cols: Columns, block: int) -> Iterator[dict[str, Any]]:
    """Rows a chunk of requests at a time (memory does not grow with the trace)."""
    seconds = np.round((cols.offset_ns - (cols.offset_ns[0] if len(cols) else 0)) / 1e9, 6)
    inputs = np.maximum(cols.input_tokens, 0)
    outputs = output_lengths(cols)[0]
    sessions, turns, types = cols.session, cols.turn, cols.request_type
    last_chat: dict[int, int] = {}
    for rows, row_ids in iter_row_ids(cols, block):
        chunk = zip(
            seconds[rows].tolist(),
            inputs[rows].tolist(),
            outputs[rows].tolist(),
            sessions[rows].tolist(),
            turns[rows].tolist(),
            types[rows].tolist(),
            row_ids,
            strict=True,
        )
        for i, (timestamp, n_in, n_out, session, turn, kind, ids) in enumerate(chunk, rows.start):
            yield {
                "chat_id": i,
                "parent_chat_id": last_chat.get(session, -1) if session else -1,
                "timestamp": timestamp,
                "input_length": n_in,
                "output_length": n_out,
                "type": kind or "text",  # a request whose class was not recorded is plain text
                "turn": max(turn, 0) + 1,
                "hash_ids": ids,
            }
            if session:
                last_chat[session] = i
