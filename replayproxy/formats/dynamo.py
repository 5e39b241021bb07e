"""NVIDIA Dynamo request traces (`dynamo.request.trace.v1`, JSONL or rotated `.jsonl.gz` segments).

Rows with `event_type: request_end` are requests: `request.request_received_ms` (UTC epoch ms),
`request.output_tokens`, `request.total_time_ms`, `request.ttft_ms`, `request.model` and
`request.replay` = `{trace_block_size, input_length, input_sequence_hashes}` (Dynamo's chained
sequence hashes of the prompt's full blocks, global across sessions). Other rows (`tool_*`,
`request_payload`) are counted and left out. `agent_context` gives the graph, as Dynamo's own
replay reads it (docs.nvidia.com/dynamo, "Agent Trace Replay"): requests of one chain
(`trajectory_id`, else `program_id`, else `session_id`) follow one another; a chain with a parent
(`parent_trajectory_id` / `parent_program_id` / `parent_session_id`) is a child branch: its first
request is spawned from the parent chain's latest request that had ended when it arrived, and the
parent chain's first request that arrived after the child's last reply ended joins it (an
inference: the record says who spawned whom, not who waited). A trace session is the root chain.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.formats.agent_graph import Call, SessionGraphs, add_linked, seconds_within
from replayproxy.formats.importing import BadLines, Imported, ImportOptions, iter_json_lines, paused_gc
from replayproxy.shape import MAX_OFFSET_S, MAX_TOKENS
from replayproxy.trace.mapped import SpilledArray

SCHEMA = "dynamo.request.trace.v1"
_CHAIN_KEYS = ("trajectory_id", "program_id", "session_id")
_PARENT_KEYS = ("parent_trajectory_id", "parent_program_id", "parent_session_id")
MAX_CHAIN_DEPTH = 64  # parent links followed to find a chain's root


class _Bad(ValueError):
    """A row that cannot be read; the message is the reason."""


def read(path: Path, options: ImportOptions) -> Imported:
    bad = BadLines(str(path), options.skip_bad)
    hashes = SpilledArray(np.dtype(np.uint64))
    calls: list[Call] = []
    spans: list[tuple[int, int]] = []  # each call's hashes in the spilled column
    chains: list[str] = []
    parent_chain: dict[str, str] = {}
    block = options.block_size
    other = 0
    with paused_gc():
        for rows, line_nos in iter_json_lines(path, bad):
            for row, line_no in zip(rows, line_nos, strict=True):
                if row.get("event_type") != "request_end":
                    other += 1
                    continue
                try:
                    call, chain, parent, ids, row_block = _request(row)
                    if block is None:
                        block = row_block
                    elif row_block != block:
                        raise _Bad(
                            f"trace_block_size {row_block} differs from {block} (one block size per file)"
                        )
                except _Bad as e:
                    bad(line_no, str(e))
                    continue
                spans.append((hashes.size, hashes.size + len(ids)))
                hashes.extend(ids)
                calls.append(call)
                chains.append(chain)
                if parent:
                    parent_chain.setdefault(chain, parent)
    flat = hashes.result().view(np.int64)
    for call, (lo, hi) in zip(calls, spans, strict=True):
        call.ids = flat[lo:hi]
    sessions = _link(calls, chains, parent_chain)
    graphs = SessionGraphs("dynamo", block or 16, model=options.model)
    dropped = add_linked(graphs, sessions, calls)
    return graphs.imported(bad, wall_clock=True, extra={"other_records": other, "dropped_links": dropped})


def _request(row: dict[str, Any]) -> tuple[Call, str, str, np.ndarray, int]:
    if row.get("schema", SCHEMA) != SCHEMA:
        raise _Bad(f"schema {row.get('schema')!r} is not {SCHEMA}")
    request = row.get("request")
    if not isinstance(request, dict):
        raise _Bad("no request object")
    replay = request.get("replay")
    if not isinstance(replay, dict):
        raise _Bad("no request.replay (input_length, input_sequence_hashes)")
    block = replay.get("trace_block_size")
    if type(block) is not int or not 0 < block <= MAX_TOKENS:
        raise _Bad(f"replay.trace_block_size {block!r} is not a positive integer")
    inputs = _count(replay, "input_length")
    outputs = _count(request, "output_tokens")
    ids = replay.get("input_sequence_hashes", [])
    if not isinstance(ids, list) or len(ids) > inputs // block + 1:
        raise _Bad(f"replay.input_sequence_hashes is not a list of at most {inputs // block + 1} hashes")
    if not all(type(h) is int and 0 <= h < 1 << 64 for h in ids):
        raise _Bad("replay.input_sequence_hashes holds something other than unsigned 64-bit integers")
    received = seconds_within(request.get("request_received_ms"), MAX_OFFSET_S * 1000)
    if received is None:
        raise _Bad(
            f"request.request_received_ms {request.get('request_received_ms')!r} is not epoch milliseconds"
        )
    model = request.get("model")
    call = Call(
        start_ns=round(received * 1e6),
        inputs=inputs,
        outputs=outputs,
        e2e_ns=_ms_ns(request, "total_time_ms"),
        ttft_ns=_ms_ns(request, "ttft_ms"),
        model=model if isinstance(model, str) and len(model) <= 128 else "",
    )
    context = row.get("agent_context")
    chain = parent = ""
    if isinstance(context, dict):
        chain = _first_string(context, _CHAIN_KEYS)
        parent = _first_string(context, _PARENT_KEYS)
    request_id = request.get("request_id")
    if not chain:  # a request without session identity is a session of its own
        chain = f"\x00{request_id}" if isinstance(request_id, str) else f"\x00#{received}"
    return call, chain, parent if parent != chain else "", np.array(ids, np.uint64), block


def _count(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOKENS:
        raise _Bad(f"{key} is {value!r}, not an integer within 0..{MAX_TOKENS}")
    return value


def _ms_ns(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if value is None:
        return -1
    ms = seconds_within(value, MAX_OFFSET_S * 1000)
    if ms is None:
        raise _Bad(f"{key} {value!r} is not a number of milliseconds")
    return round(ms * 1e6)


def _first_string(context: dict[str, Any], keys: tuple[str, ...]) -> str:
    for key in keys:
        value = context.get(key)
        if isinstance(value, str) and value:
            return value[:256]
    return ""


def _link(calls: list[Call], chains: list[str], parent_chain: dict[str, str]) -> list[str]:
    """Set each call's links (indices into `calls`) from the chains; returns each call's session
    (its root chain)."""
    order = sorted(range(len(calls)), key=lambda i: (calls[i].start_ns, i))
    by_chain: dict[str, list[int]] = {}
    for i in order:
        by_chain.setdefault(chains[i], []).append(i)
    for members in by_chain.values():
        for before, after in zip(members, members[1:], strict=False):
            calls[after].parent = before
    for chain, members in by_chain.items():
        parent = by_chain.get(parent_chain.get(chain, ""))
        if not parent:
            continue
        first, last = calls[members[0]], max(members, key=lambda i: (_end(calls[i]), i))
        ended = [i for i in parent if _end(calls[i]) <= first.start_ns]
        if ended:
            first.parent, first.spawned = max(ended, key=lambda i: (_end(calls[i]), i)), True
        waiting = [i for i in parent if calls[i].start_ns >= _end(calls[last]) and calls[last].e2e_ns >= 0]
        if waiting:
            joiner = calls[min(waiting, key=lambda i: (calls[i].start_ns, i))]
            joiner.joins = (*joiner.joins, last)
    return [_root(chain, parent_chain) for chain in chains]


def _root(chain: str, parent_chain: dict[str, str]) -> str:
    seen = {chain}
    for _ in range(MAX_CHAIN_DEPTH):
        parent = parent_chain.get(chain)
        if parent is None or parent in seen:
            break
        seen.add(parent)
        chain = parent
    return chain


def _end(call: Call) -> int:
    return call.start_ns + max(call.e2e_ns, 0)
