"""WEKA agentic-coding traces (SemiAnalysis cc-traces-weka; kv-cache-tester), read as agent sessions.

One JSON object per file (a file, or a directory of `*.json`): `id`, `block_size` (64),
`hash_id_scope` (`local`), `requests[]` of `{t, type: "s"|"n", model, in, out, hash_ids,
api_time, ttft, think_time, ...}` and `{type: "subagent", t, agent_id, status, duration_ms,
requests[...]}` entries whose inner `t` count from the sub-agent's spawn. Spec:
callanjfox/agentic-coding-analysis `docs/TRACE_FORMAT.md`; field types as AIPerf 0.13 validates
them (`aiperf/dataset/loader/weka_trace_models.py`).

- `hash_ids` are already chained (salted SHA-256 of each 64-token block with the previous hash,
  numbered per trace), so they are kept as they are, shifted past every earlier trace's ids: the
  same number in two traces is not the same block (`hash_id_scope: local`).
- A request continues the latest request of its agent that had ended (`t + api_time`) when it was
  sent, preferring among the last few the one sharing the longest hash prefix (parallel side
  calls of an agent are branches, not a chain); `think_time` is kept as its wait.
- A sub-agent's first request is spawned from its agent's latest ended request (it does not carry
  the parent's context: the spec's "isolated cache contexts"), and the agent's next request joins
  the sub-agent's last-ending request (the spec: the parent's next request occurs after the
  sub-agent completes); sub-agents with `status: async_launched` are not joined.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from replayproxy.errors import BadInputFile
from replayproxy.formats.agent_graph import MAX_CALLS, Call, SessionGraphs, seconds_within
from replayproxy.formats.importing import BadLines, Imported, ImportFormatError, ImportOptions, paused_gc
from replayproxy.shape import MAX_OFFSET_S, MAX_TOKENS

DEFAULT_BLOCK = 64
MAX_FILE_BYTES = 256 << 20  # one session's file; the published ones are a few MiB
MAX_NESTING = 8  # sub-agents inside sub-agents
CANDIDATES = 8  # latest ended requests compared by shared hash prefix when choosing a parent


class _Bad(ValueError):
    """A trace that cannot be read; the message is the reason."""


def read(path: Path, options: ImportOptions) -> Imported:
    bad = BadLines(str(path), options.skip_bad)
    graphs: SessionGraphs | None = None
    with paused_gc():
        for file in _files(path):
            try:
                trace = _load(file)
                block = _block_size(trace, options.block_size)
                if graphs is None:
                    graphs = SessionGraphs("weka", block, model=options.model, local_ids=True)
                elif block != graphs.block:
                    raise _Bad(f"block_size {block} differs from the first trace's {graphs.block}")
                calls: list[Call] = []
                _agent(trace.get("requests"), 0.0, -1, calls, 0)
            except _Bad as e:
                _report(bad, file, str(e))
                continue
            graphs.add(str(trace.get("id") or file.name), calls)
    if graphs is None:
        raise BadInputFile(f"{path}: no WEKA trace could be read")
    return graphs.imported(bad, extra={"sessions_start_together": True})


def _files(path: Path) -> Iterator[Path]:
    if path.is_dir():
        yield from sorted(p for p in path.glob("*.json") if p.is_file())
    else:
        yield path


def _report(bad: BadLines, file: Path, reason: str) -> None:
    message = f"{file}: {reason}"
    if not bad.skip:
        raise ImportFormatError(f"{message} (--skip-bad skips such files)")
    bad.count += 1
    bad.first = bad.first or message


def _load(file: Path) -> dict[str, Any]:
    size = file.stat().st_size
    if size > MAX_FILE_BYTES:
        raise _Bad(f"{size} bytes: longer than any session's trace ({MAX_FILE_BYTES})")
    try:
        trace = orjson.loads(file.read_bytes())
    except orjson.JSONDecodeError as e:
        raise _Bad(f"not a JSON object ({e})") from e
    if not isinstance(trace, dict):
        raise _Bad(f"expected a JSON object, got {type(trace).__name__}")
    scope = trace.get("hash_id_scope", "local")
    if scope != "local":
        raise _Bad(f"hash_id_scope {scope!r}: only 'local' is specified")
    return trace


def _block_size(trace: dict[str, Any], asked: int | None) -> int:
    block = trace.get("block_size", DEFAULT_BLOCK)
    if type(block) is not int or not 0 < block <= MAX_TOKENS:
        raise _Bad(f"block_size {block!r} is not a positive integer")
    if asked is not None and asked != block:
        raise _Bad(f"block_size {block} differs from --block-size {asked} (hash ids stand for the file's)")
    return block


def _agent(requests: Any, origin_s: float, spawner: int, calls: list[Call], depth: int) -> None:
    """One agent's requests (the trace's, or a sub-agent's at `origin_s`), appended to `calls`."""
    if not isinstance(requests, list):
        raise _Bad("requests is not a list")
    if depth > MAX_NESTING:
        raise _Bad(f"sub-agents nested deeper than {MAX_NESTING}")
    mine: list[int] = []  # this agent's calls, by index into `calls`
    pending: list[int] = []  # last-ending calls of sub-agents the agent's next request joins
    for entry in requests:
        if not isinstance(entry, dict):
            raise _Bad("a request is not an object")
        if entry.get("type") == "subagent":
            start = origin_s + _seconds(entry, "t", required=True)
            first = len(calls)
            _agent(entry.get("requests"), start, _latest_ended(calls, mine, start, None), calls, depth + 1)
            inner = range(first, len(calls))
            if inner and entry.get("status") != "async_launched":
                pending.append(max(inner, key=lambda i: (_end(calls[i]), i)))
            continue
        call = _call(entry, origin_s)
        if len(calls) >= MAX_CALLS:
            raise _Bad(f"more than {MAX_CALLS} requests in one trace")
        if mine:
            call.parent = _latest_ended(calls, mine, call.start_ns / 1e9, call.ids)
        elif spawner >= 0:
            call.parent, call.spawned = spawner, True
        call.joins = tuple(j for j in pending if j != call.parent)
        if call.joins:
            call.think_ns = -1  # the source's think time counts from the agent's own last reply
        pending = []
        mine.append(len(calls))
        calls.append(call)


def _latest_ended(calls: list[Call], mine: list[int], at_s: float, ids: Any) -> int:
    """Among the agent's calls ended by `at_s`, the latest few, the one sharing the longest prefix
    of `ids` (then the latest-ending); -1 when none had ended."""
    ended = [i for i in mine[-4 * CANDIDATES :] if _end(calls[i]) <= at_s * 1e9]
    if not ended:
        return -1
    latest = sorted(ended, key=lambda i: (_end(calls[i]), i))[-CANDIDATES:]
    if ids is None or not len(ids):
        return latest[-1]
    return max(latest, key=lambda i: (_shared(calls[i].ids, ids), _end(calls[i]), i))


def _shared(a: Any, b: Any) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def _end(call: Call) -> int:
    return call.start_ns + max(call.e2e_ns, 0)


def _call(entry: dict[str, Any], origin_s: float) -> Call:
    kind = entry.get("type")
    if kind not in ("s", "n"):
        raise _Bad(f"type {kind!r} is not 's', 'n' or 'subagent'")
    counts = {}
    for key in ("in", "out"):
        value = entry.get(key)
        if type(value) is not int or not 0 <= value <= MAX_TOKENS:
            raise _Bad(f"{key} is {value!r}, not an integer within 0..{MAX_TOKENS}")
        counts[key] = value
    ids = entry.get("hash_ids", [])
    if (
        not isinstance(ids, list)
        or len(ids) > MAX_TOKENS
        or not all(type(i) is int and 0 <= i < 1 << 62 for i in ids)
    ):
        raise _Bad("hash_ids is not a list of integers within 0..2**62")
    model = entry.get("model")
    think = _seconds(entry, "think_time")
    api = _seconds(entry, "api_time")
    ttft = _seconds(entry, "ttft")
    return Call(
        start_ns=round((origin_s + _seconds(entry, "t", required=True)) * 1e9),
        inputs=counts["in"],
        outputs=counts["out"],
        e2e_ns=-1 if math.isnan(api) else round(api * 1e9),
        ttft_ns=-1 if math.isnan(ttft) else round(ttft * 1e9),
        ids=np.array(ids, np.int64),
        think_ns=-1 if math.isnan(think) else round(think * 1e9),
        model=model if isinstance(model, str) and len(model) <= 128 else "",
        stream=kind == "s",
    )


def _seconds(entry: dict[str, Any], key: str, required: bool = False) -> float:
    """A time field in seconds within 0..MAX_OFFSET_S; NaN when absent (null) and not required."""
    value = entry.get(key)
    if value is None and not required:
        return math.nan
    seconds = seconds_within(value, MAX_OFFSET_S)
    if seconds is None:
        raise _Bad(f"{key} is {value!r}, not a number of seconds within 0..{MAX_OFFSET_S:g}")
    return seconds
