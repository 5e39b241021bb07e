"""Breakdowns where workloads vary: by input-length bucket, by endpoint, and per 10 s window.

Long prompts and bursts are where engines differ, so each group gets its own request and error
counts and TTFT / TPOT / E2E summaries (one sort per figure for all groups: fast on 10^6 rows).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from replayproxy.report.measures import Measures
from replayproxy.report.stats import Summary, grouped_summaries

INPUT_BUCKETS = ((0, 1024, "<1k"), (1024, 4096, "1-4k"), (4096, 16384, "4-16k"), (16384, None, ">16k"))
WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    requests: int
    errors: int
    ttft_ms: Summary
    tpot_ms: Summary
    e2e_ms: Summary
    start_s: float = 0.0  # windows only
    arrival_rate_per_s: float = 0.0  # windows only


def _groups(m: Measures, ids: np.ndarray, names: list[str], window_s: float = 0.0) -> list[Group]:
    """One Group per name; ids[i] is request i's group (-1: in none). With window_s, groups are windows."""
    n_groups = len(names)
    requests = np.bincount(ids[ids >= 0], minlength=n_groups)
    errors = np.bincount(ids[(ids >= 0) & ~m.ok], minlength=n_groups)
    ttft, tpot, e2e = (
        grouped_summaries(ids, values, n_groups) for values in (m.ttft_ms, m.tpot_ms, m.e2e_ms)
    )
    return [
        Group(
            names[g],
            int(requests[g]),
            int(errors[g]),
            ttft[g],
            tpot[g],
            e2e[g],
            start_s=g * window_s,
            arrival_rate_per_s=float(requests[g]) / window_s if window_s else 0.0,
        )
        for g in range(n_groups)
    ]


def by_input_length(m: Measures) -> list[Group]:
    """Buckets of input tokens; requests of unknown length are left out (their count is the gap)."""
    tokens = m.input_tokens
    ids = np.full(m.n, -1, np.int64)
    for g, (low, high, _) in enumerate(INPUT_BUCKETS):
        inside = tokens >= low if high is None else (tokens >= low) & (tokens < high)
        ids[inside] = g
    names = [name for _, _, name in INPUT_BUCKETS]
    return [g for g in _groups(m, ids, names) if g.requests]


def by_endpoint(m: Measures) -> list[Group]:
    names, ids = np.unique(m.requests.endpoint.astype(str), return_inverse=True)
    return _groups(m, ids.astype(np.int64), [str(name) for name in names])


def by_window(m: Measures, window_s: float = WINDOW_S) -> list[Group]:
    """Windows of send time from the run's first send; arrival rate = requests sent in it / window."""
    if not m.n:
        return []
    ids = np.floor(m.start_s / window_s).astype(np.int64)
    n_windows = int(ids.max()) + 1
    if n_windows > 4 * m.n + 16:  # mostly empty windows (a damaged or odd time line): only used ones
        used, ids = np.unique(ids, return_inverse=True)
        groups = _groups(m, ids.astype(np.int64), [f"{w * window_s:g}s" for w in used.tolist()], window_s)
        return [replace(g, start_s=w * window_s) for g, w in zip(groups, used.tolist(), strict=True)]
    names = [f"{i * window_s:g}s" for i in range(n_windows)]
    return _groups(m, ids, names, window_s)
