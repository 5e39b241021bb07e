"""Result files with known values, written with the real ResultWriter (no replayer needed)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.results import ReplayResult, ResultWriter, RunHeader

MS = 1_000_000
START_NS = 1_700_000_000 * 10**9
# Each run written gets its own start, a nanosecond after the one before, as real runs never share
# one: two files of equal header and times are one run copied, and the report counts it once.
_starts = itertools.count(START_NS)


def result(
    index: int,
    *,
    ttft_ms: float = 10.0,
    e2e_ms: float = 100.0,
    gaps_us: Sequence[int] = (),
    sent_ms: float | None = None,
    scheduled_ms: float | None = None,
    error: str = "",
    completion_tokens: int = -1,
    prompt_tokens: int = -1,
    chunk_tokens: Sequence[int] = (),
    endpoint: str = "chat",
    expected_input: int = -1,
    expected_output: int = -1,
    stream: bool = True,
) -> ReplayResult:
    sent = index * 100.0 if sent_ms is None else sent_ms
    scheduled = sent if scheduled_ms is None else scheduled_ms
    return ReplayResult(
        index=index,
        scheduled_ns=int(scheduled * MS),
        sent_ns=int(sent * MS),
        endpoint=endpoint,
        stream=stream,
        ttft_ns=-1 if error else int(ttft_ms * MS),
        e2e_ns=int(e2e_ms * MS),
        chunk_gaps_us=tuple(int(g) for g in gaps_us),
        chunk_tokens=tuple(chunk_tokens),
        content_chunks=len(gaps_us) + 1 if not error else 0,
        status=500 if error == "http_5xx" else 200,
        error=error,
        completion_tokens=completion_tokens,
        prompt_tokens=prompt_tokens,
        expected_input_tokens=expected_input,
        expected_output_tokens=expected_output,
    )


def write_run(
    path: Path,
    results: Iterable[ReplayResult],
    *,
    label: str = "",
    target: str = "http://a",
    digest: str = "d1",
    options: dict[str, Any] | None = None,
    shard: str = "",
    start_wall_ns: int | None = None,
    models: Any = None,
) -> Path:
    header = RunHeader(
        label=label,
        target=target,
        start_wall_ns=next(_starts) if start_wall_ns is None else start_wall_ns,
        trace_digest=digest,
        options=options or {},
        shard=shard,
        models=models,
    )
    with ResultWriter(path, header) as writer:
        for r in results:
            writer.write(r)
    return path


def synthetic_run(path: Path, ttft_ms: np.ndarray, e2e_ms: np.ndarray, **kw: Any) -> Path:
    """A run of len(ttft_ms) requests, 50 ms apart, 10 output tokens each."""
    results = (
        result(
            i,
            ttft_ms=float(t),
            e2e_ms=float(e),
            sent_ms=50.0 * i,
            completion_tokens=10,
            gaps_us=[int((e - t) * 1000 / 9)] * 9,
        )
        for i, (t, e) in enumerate(zip(ttft_ms, e2e_ms, strict=True))
    )
    return write_run(path, results, **kw)


def opening_of(text: str) -> list[str]:
    """The text report's verdict section (it comes first), each line as rendered before wrapping:
    a wrapped line's continuations (indented further) are joined back to it."""
    lines: list[str] = []
    for line in text.split("\n\n", 1)[0].splitlines():
        if line.startswith("    ") and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines
