"""What the engine said about itself during a run: KV usage, queueing, preemption, prefix hits.

Reads the `telemetry` side record the replayer stores (see replay/telemetry.py for the canonical
names) and reduces it to the figures that explain latency differences. Engine-side latency comes
from the difference of the engine's histograms at the start and end of the run: the mean exactly
(`_sum / _count`), each percentile only as the bucket it falls in, `[lower, upper]` bounds. Buckets
are wide (vLLM's E2E buckets step 5 s -> 10 s), so an interpolated value inside one would look
exact and could be set against the client's exact percentiles; a bucket range cannot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from replayproxy.report.document_types import EngineLatencyDoc, TelemetryDoc, TelemetryFigures

QUANTILES = (0.5, 0.9, 0.95, 0.99)


def summarize(record: dict[str, Any], requests: int) -> TelemetryDoc:
    """Per-run telemetry figures; a figure is present only when the engine exposed the metric."""
    samples = record.get("samples", [])
    summary: TelemetryFigures = {}
    times_s = np.array([s["t_ns"] for s in samples], dtype=np.float64) / 1e9
    kv = _series(samples, "kv_usage")
    if kv is not None:
        summary["kv_usage_peak"] = float(np.max(kv))
        summary["kv_usage_mean"] = float(np.mean(kv))
    waiting = _series(samples, "waiting")
    if waiting is not None:
        summary["waiting_peak"] = float(np.max(waiting))
        summary["waiting_time_share"] = _time_share(times_s, waiting > 0)
    running = _series(samples, "running")
    if running is not None:
        summary["running_peak"] = float(np.max(running))
    preemptions = _increase(samples, "preemptions")
    if preemptions is not None:
        summary["preemptions"] = preemptions
        summary["preemptions_per_1k_requests"] = 1000.0 * preemptions / requests if requests else None
    queries, hits = _increase(samples, "prefix_queries"), _increase(samples, "prefix_hits")
    if queries and hits is not None:
        summary["prefix_hit_rate"] = hits / queries
    else:
        rate = _series(samples, "prefix_hit_rate")
        if rate is not None:
            summary["prefix_hit_rate"] = float(np.mean(rate))
    start, end = record.get("histograms_start", {}), record.get("histograms_end", {})
    latency = {}
    for name, histogram in end.items():
        quantiles = histogram_quantiles(histogram, start.get(name), QUANTILES)
        if quantiles is not None:
            latency[name.removesuffix("_s")] = quantiles
    return TelemetryDoc(record.get("source", ""), len(samples), record.get("found", {}), summary, latency)


_NUMBER = (int, float)


def well_formed(record: Any) -> bool:
    """Whether a telemetry record has the layout the replayer writes: samples of numbers with a
    time, and histograms of [bound, count] buckets. A damaged one is left out of the report."""
    if not isinstance(record, dict):
        return False
    samples = record.get("samples", [])
    if not isinstance(samples, list) or not isinstance(record.get("found", {}), dict):
        return False
    for sample in samples:
        if not isinstance(sample, dict) or not isinstance(sample.get("t_ns"), _NUMBER):
            return False
        if not all(isinstance(v, _NUMBER) for k, v in sample.items() if k != "t_ns"):
            return False
    for key in ("histograms_start", "histograms_end"):
        histograms = record.get(key, {})
        if not isinstance(histograms, dict):
            return False
        for name, histogram in histograms.items():
            buckets = histogram.get("buckets") if isinstance(histogram, dict) else None
            if not isinstance(name, str) or not isinstance(buckets, list):
                return False
            if not all(
                isinstance(b, list) and len(b) == 2 and all(isinstance(x, _NUMBER) for x in b)
                for b in buckets
            ):
                return False
    return True


def over_time(record: dict[str, Any], name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(seconds since run start, values) of one canonical series, for plots."""
    samples = [s for s in record.get("samples", []) if name in s]
    if not samples:
        return None
    return np.array([s["t_ns"] for s in samples]) / 1e9, np.array(
        [s[name] for s in samples], dtype=np.float64
    )


def histogram_quantiles(
    end: dict[str, Any], start: dict[str, Any] | None, quantiles: Sequence[float]
) -> EngineLatencyDoc | None:
    """The observations made between two cumulative histogram snapshots, in ms.

    `count`; `mean` from `_sum / _count` (exact); `buckets[NN]` = (lower, upper) bounds of the
    bucket holding quantile NN (upper is None past the last finite bound).
    """
    bounds = np.array([b[0] for b in end["buckets"]], dtype=np.float64)
    counts = np.array([b[1] for b in end["buckets"]], dtype=np.float64)
    total_s = float(end.get("sum", math.nan))
    if start is not None:
        before = {b[0]: b[1] for b in start["buckets"]}
        counts = counts - np.array([before.get(b, 0.0) for b in bounds])
        total_s -= float(start.get("sum", math.nan))
    total = counts[-1] if len(counts) else 0.0
    if total <= 0:
        return None
    mean_ms = total_s / total * 1000.0
    buckets = {}
    for q in quantiles:
        i = min(int(np.searchsorted(counts, q * total, side="left")), len(bounds) - 1)
        lower = float(bounds[i - 1]) * 1000.0 if i > 0 else 0.0
        upper = float(bounds[i]) * 1000.0
        buckets[round(q * 100)] = (lower, upper if math.isfinite(upper) else None)
    return EngineLatencyDoc(float(total), mean_ms if math.isfinite(mean_ms) else None, buckets)


def _series(samples: list[dict[str, Any]], name: str) -> np.ndarray | None:
    values = [s[name] for s in samples if name in s]
    return np.array(values, dtype=np.float64) if values else None


def _increase(samples: list[dict[str, Any]], name: str) -> float | None:
    """Counter increase over the run, tolerating resets (a drop starts a new count)."""
    values = _series(samples, name)
    if values is None:
        return None
    steps = np.diff(values)
    return float(np.sum(np.where(steps >= 0, steps, values[1:])))


def _time_share(times_s: np.ndarray, condition: np.ndarray) -> float | None:
    """Share of the sampled span during which `condition` held (each sample holds until the next)."""
    if len(times_s) < 2:
        return None
    spans = np.diff(times_s)
    return float(np.sum(spans[condition[:-1]]) / np.sum(spans)) if np.sum(spans) > 0 else None
