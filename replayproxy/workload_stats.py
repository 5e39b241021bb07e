"""Workload statistics of a trace: the numbers that decide how an engine will behave under it.

Pure and vectorized over `trace.Columns` (a million requests take seconds, not minutes); the
`inspect` command renders the dict as text or JSON. Keys are stable and carry their units.
"""

from __future__ import annotations

from collections import Counter
from typing import TypedDict

import numpy as np

from replayproxy.trace import Columns
from replayproxy.trace.reuse import hit_blocks, prefix_reuse

__all__ = ["hit_blocks", "prefix_reuse", "workload_stats", "summary"]

PEAK_WINDOW_S = 1.0  # rate_peak_rps counts arrivals in windows of this length, from the first arrival


class Distribution(TypedDict):
    """Percentiles, max and mean of the known values (all None when none is known)."""

    count: int
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None
    mean: float | None


class WorkloadStats(TypedDict):
    """What `inspect` shows (as text, or as this map with --json) and a profile carries."""

    requests: int
    files: int
    duration_s: float
    rate_mean_rps: float | None
    rate_peak_rps: float | None
    rate_peak_window_s: float
    interarrival_cv: float | None
    input_tokens: Distribution
    output_tokens: Distribution
    stream_share: float | None
    endpoints: dict[str, int]
    models: dict[str, int]
    prefix_reuse: float | None
    sessions: int
    peak_concurrency: int | None
    errors: dict[str, int]
    ttft_ms: Distribution
    e2e_ms: Distribution


def workload_stats(columns: Columns) -> WorkloadStats:
    """The workload statistics: sizes, timing, mix, prefix reuse and recorded production latency."""
    n = len(columns)
    offsets = columns.offset_ns
    duration_s = float(offsets[-1] - offsets[0]) / 1e9 if n else 0.0
    gaps_s = np.diff(offsets) / 1e9
    return WorkloadStats(
        requests=n,
        files=len(columns.headers),
        duration_s=duration_s,
        rate_mean_rps=(n - 1) / duration_s if duration_s > 0 else None,
        rate_peak_rps=_peak_rate(offsets),
        rate_peak_window_s=PEAK_WINDOW_S,
        interarrival_cv=float(gaps_s.std() / gaps_s.mean()) if len(gaps_s) and gaps_s.mean() > 0 else None,
        input_tokens=summary(columns.input_tokens),
        output_tokens=summary(columns.output_tokens),
        stream_share=float(columns.stream.mean()) if n else None,
        endpoints=_counts(columns.endpoint),
        models=_counts(columns.model),
        prefix_reuse=prefix_reuse(columns),
        sessions=int(len(np.unique(columns.session[columns.session != 0]))),
        peak_concurrency=_peak_concurrency(offsets, columns.e2e_ns),
        errors=_counts(columns.error[columns.error != ""]),
        ttft_ms=summary(columns.ttft_ns, scale=1e-6),
        e2e_ms=summary(columns.e2e_ns, scale=1e-6),
    )


def summary(values: np.ndarray, scale: float = 1.0) -> Distribution:
    """Percentiles, max and mean of the known (>= 0) values; all null when none is known."""
    known = values[values >= 0].astype(np.float64) * scale
    if not len(known):
        return Distribution(count=0, p50=None, p90=None, p99=None, max=None, mean=None)
    p50, p90, p99 = (float(p) for p in np.percentile(known, [50, 90, 99]))
    return Distribution(
        count=len(known), p50=p50, p90=p90, p99=p99, max=float(known.max()), mean=float(known.mean())
    )


def _peak_rate(offsets: np.ndarray) -> float | None:
    if not len(offsets):
        return None
    windows = (offsets - offsets[0]) // int(PEAK_WINDOW_S * 1e9)
    # Offsets are sorted, so each window is a run: its length is the count. (A count per window
    # from 0 would size memory by the trace's time span, which a damaged file makes any size.)
    ends = np.flatnonzero(np.diff(windows)) + 1
    return float(np.diff(np.concatenate([[0], ends, [len(windows)]])).max() / PEAK_WINDOW_S)


def _peak_concurrency(offsets: np.ndarray, e2e_ns: np.ndarray) -> int | None:
    """Most requests in flight at once, from recorded E2E times; None when none was recorded."""
    known = e2e_ns >= 0
    if not known.any():
        return None
    starts = offsets[known]  # in arrival order
    ends = np.sort(starts + e2e_ns[known])
    # The count peaks at some arrival: the requests that arrived up to it (itself included) less
    # those that ended by then (an end at the same time comes first).
    ended = np.searchsorted(ends, starts, side="right")
    return int((np.arange(1, len(starts) + 1) - ended).max())


def _counts(values: np.ndarray) -> dict[str, int]:
    """Occurrences of each name, most frequent first (a Counter beats sorting strings)."""
    ranked = sorted(Counter(values.tolist()).items(), key=lambda pair: (-pair[1], str(pair[0])))
    return {str(name): count for name, count in ranked}
