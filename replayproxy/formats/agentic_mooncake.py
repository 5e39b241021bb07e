"""Dynamo's `agentic_mooncake` replay format: Mooncake rows with request-level dependencies.

One JSON object per line (dynamo-data-gen `AgenticMooncakeRow`): `request_id`, `session_id`,
`input_length`, `output_length`, `hash_ids` (the whole prompt's blocks), `timestamp` (ms),
`delay` (ms), `wait_for` (request ids whose completions must arrive first), `branches`,
`prefix_reset`, `tool_wait_ms`, `tool_events`. As Dynamo's replay reads it: a row with
dependencies is sent `delay + tool_wait_ms` after all of them completed (kept as `think_ns`);
a row without is sent at its `timestamp`. Here the latest dependency of its own session (in file
order) is the request it continues, the others are joins; `prefix_reset: true` makes it spawned
(its context does not carry the parent's). `branches` and `tool_events` are not needed for the
graph (the children name their parent in `wait_for`) and are not kept. A row with `wait_for` but
no `timestamp` is placed at its latest dependency's arrival plus its wait, a lower bound.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.formats.agent_graph import MAX_JOINS, Call, SessionGraphs, add_linked
from replayproxy.formats.importing import BadLines, Imported, ImportOptions, iter_json_lines, paused_gc
from replayproxy.formats.mooncake import DEFAULT_BLOCK
from replayproxy.shape import MAX_OFFSET_S, MAX_TOKENS
from replayproxy.trace.mapped import SpilledArray


class _Bad(ValueError):
    """A row that cannot be read; the message is the reason."""


def read(path: Path, options: ImportOptions) -> Imported:
    block = options.block_size or DEFAULT_BLOCK
    bad = BadLines(str(path), options.skip_bad)
    hashes = SpilledArray(np.dtype(np.uint64))
    spans: list[tuple[int, int]] = []
    calls: list[Call] = []
    sessions: list[str] = []
    index: dict[str, int] = {}  # request id -> row
    with paused_gc():
        for rows, line_nos in iter_json_lines(path, bad):
            for row, line_no in zip(rows, line_nos, strict=True):
                try:
                    name, call, ids, session = _row(row, index, calls, sessions, block)
                except _Bad as e:
                    bad(line_no, str(e))
                    continue
                index[name] = len(calls)
                spans.append((hashes.size, hashes.size + len(ids)))
                hashes.extend(ids)
                calls.append(call)
                sessions.append(session)
    flat = hashes.result().view(np.int64)
    for call, (lo, hi) in zip(calls, spans, strict=True):
        call.ids = flat[lo:hi]
    graphs = SessionGraphs("agentic_mooncake", block, model=options.model)
    dropped = add_linked(graphs, sessions, calls)
    return graphs.imported(bad, extra={"dropped_links": dropped, "time_unit": "ms"})


def _row(
    row: dict[str, Any], index: dict[str, int], calls: list[Call], sessions: list[str], block: int
) -> tuple[str, Call, np.ndarray, str]:
    name = row.get("request_id")
    if not isinstance(name, str) or not name or len(name) > 256:
        raise _Bad("no request_id")
    if name in index:
        raise _Bad(f"request_id {name!r} appears twice")
    inputs, outputs = _count(row, "input_length"), _count(row, "output_length", -1)
    ids = row.get("hash_ids") or []
    if not isinstance(ids, list) or len(ids) > -(-inputs // block):
        raise _Bad(
            f"hash_ids is not a list of at most ceil(input_length / {block}) ids (is --block-size right?)"
        )
    if not all(type(h) is int and 0 <= h < 1 << 64 for h in ids):
        raise _Bad("hash_ids holds something other than unsigned 64-bit integers")
    wait_for = row.get("wait_for") or []
    if not isinstance(wait_for, list) or len(wait_for) > MAX_JOINS + 1:
        raise _Bad(f"wait_for is not a list of at most {MAX_JOINS + 1} request ids")
    deps = []
    for dep in wait_for:
        if dep not in index:
            raise _Bad(f"wait_for names {dep!r}, not a request of an earlier line")
        deps.append(index[dep])
    session = row.get("session_id")
    if not isinstance(session, str) or not session:
        session = sessions[deps[0]] if deps else f"\x00{name}"
    wait_ms = _ms(row, "delay", 0.0) + _ms(row, "tool_wait_ms", 0.0)
    timestamp = _ms(row, "timestamp", None if not deps else -1.0)
    if timestamp < 0:  # no arrival recorded: the earliest it could have been sent
        timestamp = max(calls[d].start_ns for d in deps) / 1e6 + wait_ms
    own = [d for d in deps if sessions[d] == session]
    parent = max(own) if own else (deps[0] if deps else -1)
    prefix_reset = row.get("prefix_reset")
    if prefix_reset is not None and type(prefix_reset) is not bool:
        raise _Bad(f"prefix_reset is {prefix_reset!r}, not true or false")
    call = Call(
        start_ns=round(timestamp * 1e6),
        inputs=inputs,
        outputs=outputs,
        parent=parent,
        joins=tuple(d for d in deps if d != parent),
        spawned=bool(prefix_reset) and parent >= 0,
        think_ns=round(wait_ms * 1e6) if deps else -1,
    )
    return name, call, np.array(ids, np.uint64), session


def _count(row: dict[str, Any], key: str, missing: int | None = None) -> int:
    value = row.get(key, missing)
    if value == missing and missing is not None:
        return missing
    if type(value) is not int or not 0 <= value <= MAX_TOKENS:
        raise _Bad(f"{key} is {value!r}, not an integer within 0..{MAX_TOKENS}")
    return value


def _ms(row: dict[str, Any], key: str, missing: float | None) -> float:
    value = row.get(key)
    if value is None:
        if missing is None:
            raise _Bad(f"no {key} (a row without wait_for is sent at its timestamp)")
        return missing
    if type(value) not in (int, float) or not 0 <= value <= MAX_OFFSET_S * 1000:
        raise _Bad(f"{key} {value!r} is not a number of milliseconds within 0..{MAX_OFFSET_S * 1000:g}")
    return float(value)
