"""GitHub Copilot coding-agent traces 2026 (Azure/AzurePublicDataset), read as agent sessions.

One JSON line (gzip shards `date=YYYY-MM-DD/shard-NNNN.jsonl.gz`) per session: `session_id` and
`turns[]`, each with `llm_calls[]` (`message_id`, ISO-8601 `timestamp` = the call's start,
`duration_ms`, `model`, `result`, `tokens.prompt/completion/cached`) and `tool_batches[]`
(`timestamp`, `duration_ms`, `request_id` = the `message_id` of the call that asked for the tools,
`function_calls[]`). No text and no block hashes: a call continues the session's latest call that
had ended when it started (the tool results or the user's next message come after that reply),
and its cached tokens become a prefix shared with that call (the parent's first
`cached // block` blocks, fresh blocks after). Calls that start while the previous one is still
running are branches of the last ended call and run in parallel. Field names from the dataset's
`schema.json` and `trace_loader.py`; see docs/formats.md.
"""

from __future__ import annotations

import heapq
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from replayproxy.formats.agent_graph import MAX_CALLS, Call, SessionGraphs, seconds_within
from replayproxy.formats.importing import BadLines, Imported, ImportOptions, iter_json_lines, paused_gc
from replayproxy.shape import MAX_OFFSET_S, MAX_TOKENS, ErrorClass

DEFAULT_BLOCK = 64  # no hashes in the source: any size reproduces the cached split at its granularity
MAX_TOOL_CALLS = 1 << 16  # function calls of one tool batch


class _Bad(ValueError):
    """A session line that cannot be read; the message is the reason."""


def read(path: Path, options: ImportOptions) -> Imported:
    bad = BadLines(str(path), options.skip_bad)
    graphs = SessionGraphs("copilot", options.block_size or DEFAULT_BLOCK, model=options.model)
    tools = _ToolTally()
    with paused_gc():
        for rows, line_nos in iter_json_lines(path, bad):
            for row, line_no in zip(rows, line_nos, strict=True):
                try:
                    name, calls = _session(row, tools)
                except _Bad as e:
                    bad(line_no, str(e))
                    continue
                graphs.add(name, calls)
    return graphs.imported(bad, wall_clock=True, extra=tools.extra())


class _ToolTally:
    """Tool batches per import: how many, how many calls, how many ran more than one call at once."""

    def __init__(self) -> None:
        self.batches = self.calls = self.parallel = self.largest = 0
        self.wait_ms = 0.0

    def add(self, batch: dict[str, Any]) -> None:
        calls = batch.get("function_calls") or []
        if not isinstance(calls, list) or len(calls) > MAX_TOOL_CALLS:
            raise _Bad(f"function_calls is not a list of at most {MAX_TOOL_CALLS} calls")
        duration = batch.get("duration_ms")
        seconds = seconds_within(duration, MAX_OFFSET_S * 1000)
        if duration is not None and seconds is None:
            raise _Bad(
                f"tool batch duration_ms {duration!r} is not a number within 0..{MAX_OFFSET_S * 1000:g}"
            )
        if not calls:  # the dataset's own loader counts only batches with calls
            return
        self.batches += 1
        self.calls += len(calls)
        self.parallel += len(calls) > 1
        self.largest = max(self.largest, len(calls))
        self.wait_ms += seconds or 0.0

    def extra(self) -> dict[str, Any]:
        return {
            "tool_batches": self.batches, "tool_calls": self.calls, "parallel_tool_batches": self.parallel,
            "largest_tool_batch": self.largest, "tool_batch_seconds": round(self.wait_ms / 1000, 3),
        }  # fmt: skip


def _session(row: dict[str, Any], tools: _ToolTally) -> tuple[str, list[Call]]:
    """The session's calls in start order with their links (raises _Bad with the reason)."""
    name = row.get("session_id")
    if not isinstance(name, str) or not name:
        raise _Bad("no session_id")
    turns = row.get("turns")
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise _Bad("turns is not a list of objects")
    raw: list[Any] = []
    for turn in turns:
        calls, batches = turn.get("llm_calls") or [], turn.get("tool_batches") or []
        if not isinstance(calls, list) or not isinstance(batches, list):
            raise _Bad("llm_calls and tool_batches must be lists")
        if len(raw) + len(calls) > MAX_CALLS:
            raise _Bad(f"more than {MAX_CALLS} LLM calls in one session")
        raw += calls
        for batch in batches:
            if not isinstance(batch, dict):
                raise _Bad("a tool batch is not an object")
            tools.add(batch)
    parsed = sorted((_call(c) for c in raw), key=lambda c: c.start_ns)
    running: list[tuple[int, int]] = []  # (end, index) of calls not yet ended, a heap
    latest = (-1, -1)  # the latest-ending call that had ended, so far
    for i, call in enumerate(parsed):
        while running and running[0][0] <= call.start_ns:
            latest = max(latest, heapq.heappop(running))
        call.parent = latest[1]
        heapq.heappush(running, (call.start_ns + call.e2e_ns, i))
    return name, parsed


def _call(call: Any) -> Call:
    if not isinstance(call, dict):
        raise _Bad("an LLM call is not an object")
    tokens = call.get("tokens")
    if not isinstance(tokens, dict):
        raise _Bad("an LLM call has no tokens object")
    counts = {}
    for key in ("prompt", "completion", "cached"):
        value = tokens.get(key, 0 if key == "cached" else None)
        if type(value) is not int or not 0 <= value <= MAX_TOKENS:
            raise _Bad(f"tokens.{key} is {value!r}, not an integer within 0..{MAX_TOKENS}")
        counts[key] = value
    if counts["cached"] > counts["prompt"]:
        raise _Bad(f"tokens.cached {counts['cached']} is more than tokens.prompt {counts['prompt']}")
    duration = seconds_within(call.get("duration_ms"), MAX_OFFSET_S * 1000)
    if duration is None:
        raise _Bad(
            f"duration_ms {call.get('duration_ms')!r} is not a number within 0..{MAX_OFFSET_S * 1000:g}"
        )
    model = call.get("model")
    return Call(
        start_ns=_utc_ns(call.get("timestamp")),
        inputs=counts["prompt"],
        outputs=counts["completion"],
        e2e_ns=round(duration * 1e6),
        cached=counts["cached"],
        model=model if isinstance(model, str) and len(model) <= 64 else "",
        error=_error(call.get("result")),
    )


_ERRORS: dict[str, ErrorClass] = {"Success": "", "UserCancel": "client_cancel"}


def _error(result: Any) -> ErrorClass:
    """`Success` (or no result) is a success, `UserCancel` a client cancel, anything else `other`."""
    if result is None:
        return ""
    return _ERRORS.get(result, "other") if isinstance(result, str) else "other"


def _utc_ns(text: Any) -> int:
    """ISO-8601 → UTC nanoseconds since the epoch; a time without a zone is UTC."""
    if not isinstance(text, str) or len(text) > 64:
        raise _Bad(f"timestamp {text!r} is not an ISO-8601 date-time")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as e:
        raise _Bad(f"timestamp {text!r} is not an ISO-8601 date-time") from e
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    seconds = moment.timestamp()
    if not 0 <= seconds <= MAX_OFFSET_S:
        raise _Bad(f"timestamp {text!r} is out of range")
    return round(seconds * 1e9)
