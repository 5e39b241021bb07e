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
from replayproxy.formats.block_meaning import BlockMeaning
from replayproxy.formats.blocks import ReuseTally, export_block, iter_row_ids
from replayproxy.formats.chained_hashes import ChainedHashes
from replayproxy.formats.exporting import (
    ExportOptions,
    ExportResult,
    aiperf_command,
    output_lengths,
    row_chunks,
    vllm_timed_trace_command,
    write_json_lines,
)
from replayproxy.formats.importing import (
    BadLines,
    Coded,
    Imported,
    ImportOptions,
    SpilledColumns,
    iter_json_lines,
    keep_good,
    paused_gc,
    unit_warnings,
)
from replayproxy.shape import REQUEST_TYPES
from replayproxy.trace import Columns
from replayproxy.trace.mapped import mapped_array

DEFAULT_BLOCK = 16


_PARTS = ("offset_ns", "inputs", "outputs", "chats", "parents", "turns")  # int64 columns


def read(path: Path, options: ImportOptions) -> Imported:
    """Parse a Bailian file a batch of lines at a time: sessions follow parent_chat_id links to their
    root chat once every chat id is known (two numbers a row until then)."""
    bad = BadLines(str(path), options.skip_bad)
    block = options.block_size or DEFAULT_BLOCK
    unit_ns = mooncake.UNIT_NS[options.time_unit or "s"]
    hashes = ChainedHashes(block)
    meaning = BlockMeaning()
    spilled = SpilledColumns(**dict.fromkeys(_PARTS, np.int64), ts=np.float64)
    with paused_gc():
        for rows, line_nos in iter_json_lines(path, bad):
            rows, line_nos = keep_good(rows, line_nos, _problem, bad)
            columns = mooncake.row_columns(rows)
            rows, columns = mooncake.valid_rows(rows, columns, line_nos, block, bad, unit_ns)
            ts, inputs, outputs, ids, counts = columns
            meaning.add(_kept_ids(ids, counts, inputs, block), hashes.add(ids, counts, inputs))
            spilled.add(
                ts=ts,
                offset_ns=np.rint(ts * unit_ns).astype(np.int64),
                inputs=inputs,
                outputs=outputs,
                chats=np.array([r["chat_id"] for r in rows], np.int64),
                parents=np.array([r["parent_chat_id"] for r in rows], np.int64),
                turns=np.array([max(r["turn"] - 1, 0) for r in rows], np.int64),
            )
            spilled.add_strings("types", (_request_type(r.get("type")) for r in rows))
    parts = spilled.result()
    changed = meaning.changed()
    types = parts.get("types", Coded(np.zeros(0, object), np.zeros(0, np.uint32)))
    unit = options.time_unit or "s"
    return Imported(
        source="bailian",
        offset_ns=parts["offset_ns"],
        input_tokens=parts["inputs"],
        output_tokens=parts["outputs"],
        bad=bad,
        block_size=block,
        hashes=hashes,
        columns={
            # the links are followed over all chats at once, the one step that holds them in memory
            "session": mapped_array([_root_sessions(parts["chats"], parts["parents"])], np.uint64),
            "turn": parts["turns"],
            "request_type": types,
            **({"model": options.model} if options.model else {}),
        },
        extra={
            "request_types": sorted(types.table.tolist()),
            "time_unit": unit,
            "blocks_changed_meaning": changed,
        },
        warnings=unit_warnings(parts["ts"], unit, str(path)),
        notes=[
            f"{changed} of {meaning.blocks} blocks changed meaning: their id was seen before after "
            "another prefix (a hit by id, not by prefix); chained, they are new blocks"
        ],
    )


def _kept_ids(ids: np.ndarray, counts: np.ndarray, inputs: np.ndarray, block: int) -> np.ndarray:
    """The ids of each row's full blocks (the ones chained), flat."""
    keep = np.minimum(counts, np.maximum(inputs, 0) // block)
    starts = np.cumsum(counts) - counts
    position = np.arange(len(ids)) - np.repeat(starts, counts)
    kept: np.ndarray = ids[position < np.repeat(keep, counts)]
    return kept


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
        if abs(row[name]) >= _ID_LIMIT:
            return f"{name} {row[name]} is out of range (|value| < 2**62)"
    if "timestamp" not in row or "output_length" not in row:
        return "no timestamp" if "timestamp" not in row else "no output_length"
    return mooncake.row_problem(row)


_ID_LIMIT = 1 << 62
_WALK_STEPS = 64  # parent links followed for all chats at once; longer or looping chains one by one


def _root_sessions(chats: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """Session = the root chat reached through parent links, + 1 (chat 0 must not read as "no
    session"); chats without follow-ups get none (0). A chat id listed twice takes its last row's
    parent; a parent absent from the file ends the chain; a loop ends where it first comes back."""
    if not len(chats):
        return np.zeros(0, np.uint64)
    known, last_from_end = np.unique(chats[::-1], return_index=True)
    parent_of = parents[::-1][last_from_end]
    at = np.minimum(np.searchsorted(known, parent_of), len(known) - 1)
    step = np.where((parent_of != -1) & (known[at] == parent_of), at, -1)  # index of the parent chat
    root = _walk(step)
    has_children = np.isin(known, parent_of[parent_of != -1])
    chat = np.searchsorted(known, chats)
    linked = (parents != -1) | has_children[chat]
    sessions: np.ndarray = np.where(linked, known[root[chat]] + 1, 0).astype(np.uint64)
    return sessions


def _walk(step: np.ndarray) -> np.ndarray:
    """Per chat, the chat its parent links lead to (`step`: the parent's index, -1 at a root)."""
    at = np.arange(len(step))
    moving = np.flatnonzero(step != -1)
    for _ in range(_WALK_STEPS):
        if not len(moving):
            return at
        at[moving] = step[at[moving]]
        moving = moving[step[at[moving]] != -1]
    links = step.tolist()
    for start in moving.tolist():  # a chain longer than _WALK_STEPS, or a loop: as a walk
        chat, seen = start, set()
        while links[chat] != -1 and chat not in seen:
            seen.add(chat)
            chat = links[chat]
        at[start] = chat
    return at


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    """Bailian rows re-blocked to `--block-size` (default: the trace's block size, else Bailian's 16);
    chat ids number requests in arrival order."""
    block = export_block(cols, options.block_size, DEFAULT_BLOCK)
    tally = ReuseTally(block)
    rows = write_json_lines(path, _rows(cols, block, tally))
    notes = [vllm_timed_trace_command(path, rows, block, 1.0, options)]
    if _has_linked_turns(cols):
        # AIPerf reads a linked turn as a delta and appends the earlier turns and replies itself,
        # while a Bailian row holds the whole conversation: its prompts would grow twice.
        notes.append("AIPerf: not for this file (multi-turn); export --format mooncake --sessions for AIPerf")
    else:
        notes.insert(0, aiperf_command(path, "bailian_trace", block, options))
    notes.append(f"replayproxy: replayproxy import {path} --format bailian --block-size {block} -o TRACE.rpt")
    return ExportResult(rows, notes, reuse=tally.reuse, block_size=block)


def _has_linked_turns(cols: Columns) -> bool:
    for rows in row_chunks(len(cols)):
        if np.any((cols.session[rows] != 0) & (cols.turn[rows] > 0)):
            return True
        cols.release(rows)
    return False


def _rows(cols: Columns, block: int, tally: ReuseTally) -> Iterator[dict[str, Any]]:
    """Rows a chunk of requests at a time (memory does not grow with the trace)."""
    origin = cols.offset_ns[0] if len(cols) else 0
    sessions, turns, types = cols.session, cols.turn, cols.request_type
    last_chat: dict[int, int] = {}
    for rows, row_ids in iter_row_ids(cols, block, tally):
        chunk = zip(
            np.round((cols.offset_ns[rows] - origin) / 1e9, 6).tolist(),
            np.maximum(cols.input_tokens[rows], 0).tolist(),
            output_lengths(cols, rows)[0].tolist(),
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
