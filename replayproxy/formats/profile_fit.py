"""Fitting a workload profile: a trace's statistical shape as JSON, the input of `synth --profile`.

It holds what `inspect --json` shows (when given) plus fitted distributions a generator can sample:
length quantiles with their rank dependence, the arrival rate over time with the burstiness left
after removing it (gamma shape of rate-normalized gaps), and the prefix-reuse structure (groups
by first block, reused-block fractions, session turns). `profile_synth` samples it; the model and
its tolerances are in docs/formats.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from replayproxy.formats.blocks import source_blocks
from replayproxy.formats.exporting import ExportOptions, ExportResult
from replayproxy.trace import Columns
from replayproxy.trace.mapped import gather, is_mapped
from replayproxy.trace.reuse import value_ranges

FORMAT = "replayproxy-profile"
VERSION = 1
QUANTILES = 201  # points of each inverse CDF (every 0.5 %)
COPULA_BINS = 16  # rank-dependence grid of (input, output)
GAP_RUN = 256  # consecutive normalized gaps per run kept in a profile (longer than a minute's arrivals)
GAP_RUNS = 64  # runs kept at most: the profile stays small whatever the trace's size
WINDOWS = 200  # rate-series windows over the trace (at most; at least 1 s and ~20 arrivals each)
BIG_GROUP_SHARE = 0.01  # groups holding at least this share keep it when traffic is scaled


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    profile = fit_profile(cols, inspect=options.inspect)
    path.write_bytes(orjson.dumps(profile, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return ExportResult(len(cols), [f"replayproxy synth --profile {path} --rate-scale 2 -o scaled.rpt"])


def fit_profile(cols: Columns, inspect: Mapping[str, object] | None = None) -> dict[str, Any]:
    """Everything `shapes_from_profile` needs, from loaded trace columns."""
    size, unit = source_blocks(cols)
    profile: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "requests": len(cols),
        "block": {"size": size, "unit": unit},
        "lengths": fit_lengths(cols.input_tokens, cols.output_tokens),
        "arrivals": fit_arrivals(cols.offset_ns),
        "prefix": fit_prefix(cols),
        "sessions": fit_sessions(cols),
        "mix": _mix(cols),
    }
    profile["duration_s"] = profile["arrivals"]["duration_s"]
    if inspect is not None:
        profile["inspect"] = inspect
    return profile


def quantile_table(values: np.ndarray) -> list[float]:
    """The inverse CDF at QUANTILES evenly spaced probabilities (empty → [])."""
    if not len(values):
        return []
    return [float(q) for q in np.quantile(values.astype(np.float64), np.linspace(0, 1, QUANTILES))]


def fit_lengths(inputs: np.ndarray, outputs: np.ndarray) -> dict[str, Any]:
    """Marginal quantiles of input and output tokens and a rank histogram of their dependence."""
    both = (inputs >= 0) & (outputs >= 0)
    grid = np.zeros((COPULA_BINS, COPULA_BINS), np.int64)
    if both.any():
        u = _ranks(inputs[both])
        v = _ranks(outputs[both])
        np.add.at(
            grid,
            (
                np.minimum((u * COPULA_BINS).astype(int), COPULA_BINS - 1),
                np.minimum((v * COPULA_BINS).astype(int), COPULA_BINS - 1),
            ),
            1,
        )
    return {
        "input_tokens": quantile_table(inputs[inputs >= 0]),
        "output_tokens": quantile_table(outputs[outputs >= 0]),
        "rank_grid": grid.tolist(),
        "summary": {
            name: _summary(v[v >= 0]) for name, v in (("input_tokens", inputs), ("output_tokens", outputs))
        },
    }


def _ranks(values: np.ndarray) -> np.ndarray:
    """Mid-ranks scaled to (0, 1): ties share a rank, so lumpy lengths keep their dependence."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    first = np.searchsorted(sorted_values, sorted_values, side="left")
    last = np.searchsorted(sorted_values, sorted_values, side="right")
    ranks = np.empty(len(values))
    ranks[order] = (first + last) / 2
    return ranks / len(values)


def _summary(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        return {}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(values.max()),
        "mean": float(values.mean()),
    }


def fit_arrivals(offset_ns: np.ndarray) -> dict[str, Any]:
    """Rate per window, raw inter-arrival CV, and the gamma shape of rate-normalized gaps."""
    t = np.sort(offset_ns.astype(np.float64)) / 1e9
    t -= t[0] if len(t) else 0.0
    duration = float(t[-1]) if len(t) > 1 else 0.0
    # Windows long enough to hold ~20 arrivals: shorter ones would copy the clumping into the rate series
    # and count it twice (again in the gamma shape of the gaps).
    window = max(1.0, duration / WINDOWS, 20 * duration / max(len(t) - 1, 1))
    counts = np.bincount(
        np.minimum((t / window).astype(np.int64), max(int(np.ceil(duration / window)) - 1, 0))
    )
    gaps = np.diff(t)
    raw_cv = float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else 0.0
    # Time change: Λ(t) counts expected arrivals; gaps in Λ have mean 1 whatever the rate does.
    edges = np.arange(len(counts) + 1) * window
    cumulative = np.concatenate([[0.0], np.cumsum(counts)])
    local = np.diff(np.interp(t, edges, cumulative))
    local_cv = float(local.std() / local.mean()) if len(local) > 1 and local.mean() > 0 else 1.0
    return {
        "duration_s": duration,
        "window_s": window,
        "rate_per_s": (counts / window).tolist(),
        "mean_rate_per_s": len(t) / duration if duration > 0 else 0.0,
        "interarrival_cv": raw_cv,
        "local_cv": local_cv,
        "gamma_shape": float(np.clip(1 / max(local_cv, 1e-3) ** 2, 0.05, 100.0)),
        "gap_runs": gap_runs(local / local.mean() if len(local) and local.mean() > 0 else local),
    }


def gap_runs(gaps: np.ndarray) -> list[list[float]]:
    """Runs of consecutive rate-normalized gaps, spread evenly over the trace.

    A gamma renewal process matches the gaps' CV but not how they follow each other: arrivals in
    regular clumps (the Mooncake conversation trace's ~3 s buckets: gap CV 3, yet a steady count
    per minute) would become random bursts, doubling the per-minute rate variation. Resampling
    whole runs keeps both the gap distribution and its short-range order.
    """
    if len(gaps) < GAP_RUN:
        return [np.round(gaps, 4).tolist()] if len(gaps) else []
    starts = np.linspace(0, len(gaps) - GAP_RUN, min(GAP_RUNS, len(gaps) // GAP_RUN)).astype(np.int64)
    return [np.round(gaps[s : s + GAP_RUN], 4).tolist() for s in starts.tolist()]


def block_reuse(cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """Per request: full blocks, and leading blocks already seen in an earlier request (infinite cache)."""
    counts = np.diff(cols.prefix_index)
    hashes = cols.prefix_hashes
    if not len(hashes):
        return counts, np.zeros(len(counts), np.int64)
    if is_mapped(hashes):  # one range of values at a time: equal hashes share a range
        reused = np.zeros(len(counts), np.int64)
        for values, positions in value_ranges(hashes, with_positions=True):
            later = np.ones(len(values), bool)
            later[np.unique(values, return_index=True)[1]] = False  # values are in position order
            rows = np.searchsorted(cols.prefix_index, positions[later], side="right") - 1
            reused += np.bincount(rows, minlength=len(counts))
        return counts, reused
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    seen = (first[inverse] < np.arange(len(hashes))).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    reused = np.zeros(len(counts), np.int64)
    has = counts > 0
    reused[has] = np.add.reduceat(seen, starts[has])
    return counts, reused


def fit_prefix(cols: Columns) -> dict[str, Any]:
    """Groups by first block (big ones keep their share when scaled), reuse fractions, concurrency."""
    counts, reused = block_reuse(cols)
    has = np.flatnonzero(counts > 0)
    result: dict[str, Any] = {
        "reuse_ratio": float(reused.sum() / counts.sum()) if counts.sum() else 0.0,
        "with_blocks": float(len(has) / max(len(counts), 1)),
    }
    if not len(has):
        return result | {
            "big_groups": [],
            "small_sizes": [],
            "small_counts": [],
            "concurrent_small": 0,
            "reuse_edges": [],
            "reuse_quantiles": [],
        }
    first_block = gather(cols.prefix_hashes, cols.prefix_index[has])
    groups, group_of, sizes = np.unique(first_block, return_inverse=True, return_counts=True)
    big = sizes >= max(2, BIG_GROUP_SHARE * len(has))
    small_sizes, small_counts = np.unique(sizes[~big], return_counts=True)
    times = cols.offset_ns[has].astype(np.float64) / 1e9
    spans = np.zeros(len(groups))
    np.maximum.at(spans, group_of, times)
    starts = np.full(len(groups), np.inf)
    np.minimum.at(starts, group_of, times)
    duration = max(float(times.max() - times.min()), 1e-9)
    concurrent = float(((spans - starts)[~big & (sizes > 1)]).sum() / duration)
    is_first = np.zeros(len(has), bool)
    is_first[np.unique(group_of, return_index=True)[1]] = True
    fraction = reused[has] / counts[has]
    edges = np.quantile(counts[has], [0.25, 0.5, 0.75]).tolist()
    bucket = np.searchsorted(edges, counts[has], side="right")
    return result | {
        "big_groups": sorted((float(s / len(has)) for s in sizes[big]), reverse=True),
        "small_sizes": small_sizes.tolist(),
        "small_counts": small_counts.tolist(),
        "concurrent_small": concurrent,
        "reuse_edges": edges,  # full-block counts splitting requests into 4 buckets
        "reuse_quantiles": [quantile_table(fraction[~is_first & (bucket == b)]) for b in range(4)],
    }


def fit_sessions(cols: Columns) -> dict[str, Any]:
    """Share of requests in sessions, turns per session and how many sessions run at once."""
    sessions = cols.session
    inside = sessions != 0
    if not inside.any():
        return {"share": 0.0, "turn_sizes": [], "turn_counts": [], "concurrent": 0.0}
    ids, of, turns = np.unique(sessions[inside], return_inverse=True, return_counts=True)
    times = cols.offset_ns[inside].astype(np.float64) / 1e9
    ends = np.zeros(len(ids))
    np.maximum.at(ends, of, times)
    starts = np.full(len(ids), np.inf)
    np.minimum.at(starts, of, times)
    duration = max(float(cols.offset_ns.max() - cols.offset_ns.min()) / 1e9, 1e-9)
    sizes, size_counts = np.unique(turns, return_counts=True)
    return {
        "share": float(inside.mean()),
        "turn_sizes": sizes.tolist(),
        "turn_counts": size_counts.tolist(),
        "concurrent": float((ends - starts).sum() / duration),
    }


def _mix(cols: Columns) -> dict[str, Any]:
    """Shares of models and endpoints, and the streamed fraction."""

    def shares(values: np.ndarray) -> dict[str, float]:
        names, counts = np.unique(values.astype(str), return_counts=True)
        return {str(n): float(c / len(values)) for n, c in zip(names, counts, strict=True)}

    return {
        "model": shares(cols.model),
        "endpoint": shares(cols.endpoint),
        "stream": float(cols.stream.mean()),
    }
