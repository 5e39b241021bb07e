"""Tokens resident in the KV cache over time, from a trace's or a replay's request timings.

A request holds its input tokens from arrival (send) to its end, plus the tokens generated so
far: linear between the first token and the end, or through its chunk times when recorded. The
sum over requests is piecewise linear in time, so an event sweep (sort, cumulative sums) gives
it exactly: fast for millions of requests. Prefix-cache sharing is not counted (an upper bound).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from replayproxy.results import ResultFile
from replayproxy.trace import Columns

CHUNK_POINTS = 8  # chunk-timed progress is followed through this many segments per request


@dataclass(frozen=True, slots=True)
class Timings:
    """Per-request arrays on one time axis (ns). -1 marks unknown ttft/e2e (filled by `estimate`)."""

    arrival_ns: np.ndarray
    ttft_ns: np.ndarray  # relative to arrival
    e2e_ns: np.ndarray  # relative to arrival
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    chunk_gaps_us: np.ndarray  # flat; request i's gaps at chunk_index[i]:chunk_index[i + 1]
    chunk_index: np.ndarray
    chunk_tokens: np.ndarray | None = None  # flat, same layout with one more entry per request
    chunk_tokens_index: np.ndarray | None = None


def from_trace(cols: Columns) -> Timings:
    return Timings(
        arrival_ns=cols.offset_ns.astype(np.int64),
        ttft_ns=cols.ttft_ns.astype(np.int64),
        e2e_ns=cols.e2e_ns.astype(np.int64),
        input_tokens=cols.input_tokens.astype(np.int64),
        output_tokens=np.where(cols.output_tokens >= 0, cols.output_tokens, cols.max_tokens).astype(np.int64),
        chunk_gaps_us=cols.chunk_gaps_us.astype(np.int64),
        chunk_index=cols.chunk_index.astype(np.int64),
    )


def from_results(files: list[ResultFile]) -> Timings:
    """Runs' requests on one axis (files aligned by their start time: shards of one run)."""
    base = min(f.header.start_wall_ns for f in files)
    parts = [_result_timings(f, f.header.start_wall_ns - base) for f in files]
    gaps = [p[5] for p in parts]
    tokens = [p[7] for p in parts]
    return Timings(
        *(np.concatenate([p[i] for p in parts]) for i in range(5)),
        chunk_gaps_us=np.concatenate(gaps),
        chunk_index=_join_index([p[6] for p in parts]),
        chunk_tokens=np.concatenate(tokens),
        chunk_tokens_index=_join_index([p[8] for p in parts]),
    )


def _result_timings(f: ResultFile, shift_ns: int) -> tuple[np.ndarray, ...]:
    col = f.column
    inputs = np.where(col("prompt_tokens") >= 0, col("prompt_tokens"), col("expected_input_tokens"))
    gaps, gaps_index = f.ragged("chunk_gaps_us")
    tokens, tokens_index = f.ragged("chunk_tokens")
    streamed = np.add.reduceat(np.append(tokens, 0).astype(np.int64), tokens_index[:-1]) * (np.diff(tokens_index) > 0)
    failed_output = np.where(streamed > 0, streamed, col("content_chunks"))
    expected = np.where(col("error") == "", col("expected_output_tokens"), failed_output)
    outputs = np.where(col("completion_tokens") >= 0, col("completion_tokens"), expected)
    arrays = (col("sent_ns") + shift_ns, col("ttft_ns"), col("e2e_ns"), inputs, outputs)
    return (*(a.astype(np.int64) for a in arrays), gaps.astype(np.int64), gaps_index, tokens, tokens_index)


def _join_index(indexes: list[np.ndarray]) -> np.ndarray:
    offsets = np.cumsum([0] + [int(ix[-1]) for ix in indexes[:-1]])
    return np.concatenate([indexes[0][:1]] + [ix[1:] + off for ix, off in zip(indexes, offsets, strict=True)])


def estimate(t: Timings, assume_ttft_ns: int, assume_tpot_ns: int) -> tuple[Timings, int, int]:
    """Fill unknown ends as ttft + (output - 1) x tpot; requests without token counts hold nothing.

    Returns the filled timings, how many requests were estimated and how many were left out.
    """
    skip = (t.input_tokens < 0) | (t.output_tokens < 0)
    missing = (t.e2e_ns < 0) & ~skip
    ttft = np.where(missing & (t.ttft_ns < 0), assume_ttft_ns, t.ttft_ns)
    e2e = np.where(missing, ttft + np.maximum(t.output_tokens - 1, 0) * assume_tpot_ns, t.e2e_ns)
    filled = replace(
        t,
        ttft_ns=ttft,
        e2e_ns=np.where(skip, 0, e2e),
        input_tokens=np.where(skip, 0, t.input_tokens),
        output_tokens=np.where(skip, 0, t.output_tokens),
    )
    return filled, int(np.count_nonzero(missing)), int(np.count_nonzero(skip))


def progress_points(t: Timings, points: int = CHUNK_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(times ns, tokens generated) at `points` + 1 moments of each request, first token to last.

    With chunk gaps recorded, the moments are chunk arrivals spread evenly over the chunks and the
    tokens follow the chunks (their reported sizes, else equal shares); otherwise both are linear
    from the first token to the end. Rows of requests without a first token are all zero.
    """
    n = len(t.arrival_ns)
    first = t.arrival_ns + t.ttft_ns
    end = np.maximum(t.arrival_ns + t.e2e_ns, first)
    out = t.output_tokens.astype(np.float64)
    start_tokens = np.minimum(out, 1.0)
    share = np.arange(points + 1) / points  # (P,)
    times = first[:, None] + ((end - first)[:, None] * share).astype(np.int64)
    tokens = start_tokens[:, None] + (out - start_tokens)[:, None] * share
    gaps = np.diff(t.chunk_index)
    chunked = np.flatnonzero((gaps > 0) & (t.ttft_ns >= 0))
    if len(chunked):
        g = gaps[chunked][:, None]
        j = (np.arange(points + 1) * g) // points  # chunk numbers, 0..g, per row
        cum_us = np.concatenate([[0], np.cumsum(t.chunk_gaps_us)])
        base = t.chunk_index[chunked][:, None]
        offset_ns = (cum_us[base + j] - cum_us[base]) * 1000
        times[chunked] = np.minimum(first[chunked][:, None] + offset_ns, end[chunked][:, None])
        tokens[chunked] = _chunk_tokens(t, chunked, j, g) * out[chunked][:, None]
    no_first = t.ttft_ns < 0
    times[no_first] = t.arrival_ns[no_first][:, None]
    tokens[no_first] = 0.0
    assert times.shape == (n, points + 1)
    return times, tokens


def _chunk_tokens(t: Timings, rows: np.ndarray, j: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Fraction of the output present after chunk j: reported chunk sizes where they match, else equal."""
    equal = (j + 1) / (g + 1)
    if t.chunk_tokens is None or t.chunk_tokens_index is None or not len(t.chunk_tokens):
        return equal
    index = t.chunk_tokens_index
    counts = np.diff(index)[rows][:, None]
    cum = np.concatenate([[0], np.cumsum(t.chunk_tokens, dtype=np.int64)])
    base = index[rows][:, None]
    total = cum[base + counts] - cum[base]
    usable = (counts == g + 1) & (total > 0)
    reported = (cum[base + np.minimum(j + 1, counts)] - cum[base]) / np.maximum(total, 1)
    return np.where(usable, reported, equal)


@dataclass(frozen=True, slots=True)
class Curve:
    """Resident tokens over time: linear between `times`, jumping at each of them."""

    times_ns: np.ndarray  # sorted, distinct
    after: np.ndarray  # value just after the jump at times_ns[k]
    before: np.ndarray  # value just before it (the end of the previous segment)
    concurrency: np.ndarray  # requests in flight just after times_ns[k]

    @property
    def duration_ns(self) -> int:
        return int(self.times_ns[-1] - self.times_ns[0]) if len(self.times_ns) else 0

    def peak(self) -> tuple[float, int]:
        """(highest resident tokens, when: ns on the timings' axis)."""
        if not len(self.times_ns):
            return 0.0, 0
        k_after, k_before = int(np.argmax(self.after)), int(np.argmax(self.before))
        if self.before[k_before] > self.after[k_after]:
            return float(self.before[k_before]), int(self.times_ns[k_before])
        return float(self.after[k_after]), int(self.times_ns[k_after])

    def _segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return np.diff(self.times_ns).astype(np.float64), self.after[:-1], self.before[1:]

    def mean(self) -> float:
        dt, v0, v1 = self._segments()
        return float(np.sum(dt * (v0 + v1) / 2) / dt.sum()) if dt.sum() > 0 else 0.0

    def time_at_or_below_ns(self, level: float) -> float:
        dt, v0, v1 = self._segments()
        rise = v1 - v0
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(rise > 1e-9, np.clip((level - v0) / rise, 0.0, 1.0), (v0 <= level).astype(float))
        return float(np.sum(dt * frac))

    def time_above_ns(self, level: float) -> float:
        return max(self.duration_ns - self.time_at_or_below_ns(level), 0.0)

    def first_above_ns(self, level: float) -> int | None:
        """The first moment the resident tokens exceed `level`, or None."""
        over = np.flatnonzero((self.after > level) | (np.append(self.before[1:], 0.0) > level))
        if not len(over):
            return None
        k = int(over[0])
        if self.after[k] > level:
            return int(self.times_ns[k])
        fraction = (level - self.after[k]) / (self.before[k + 1] - self.after[k])
        return int(self.times_ns[k] + fraction * (self.times_ns[k + 1] - self.times_ns[k]))

    def quantile(self, q: float) -> float:
        """The level the resident tokens stay at or below for a fraction q of the time."""
        total = float(self.duration_ns)
        if total <= 0:
            return self.peak()[0]
        low, high = 0.0, self.peak()[0]
        while high - low > 0.5:
            mid = (low + high) / 2
            if self.time_at_or_below_ns(mid) >= q * total:
                high = mid
            else:
                low = mid
        return high


def residency(t: Timings, points: int = CHUNK_POINTS) -> Curve:
    """The event sweep: per-request jumps and slope changes, summed by time with cumulative sums."""
    times, tokens = progress_points(t, points)
    inputs = t.input_tokens.astype(np.float64)
    end = np.maximum(t.arrival_ns + t.e2e_ns, times[:, -1])
    dt = np.diff(times, axis=1)
    d_tokens = np.diff(tokens, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        slopes = np.where(dt > 0, d_tokens / dt, 0.0)
    jumps = np.concatenate([tokens[:, :1], np.where(dt > 0, 0.0, d_tokens)], axis=1)
    zero = np.zeros((len(slopes), 1))
    slope_changes = np.concatenate([slopes, zero], axis=1) - np.concatenate([zero, slopes], axis=1)
    holds = (inputs + t.output_tokens) > 0
    event_times = np.concatenate([t.arrival_ns, times.ravel(), end])
    event_jumps = np.concatenate([inputs, jumps.ravel(), -(inputs + tokens[:, -1])])
    event_slopes = np.concatenate([np.zeros(len(inputs)), slope_changes.ravel(), np.zeros(len(inputs))])
    event_count = np.concatenate([holds, np.zeros(times.size), -holds.astype(np.int64)])
    unique, where = np.unique(event_times, return_inverse=True)
    jump = np.bincount(where, event_jumps, len(unique))
    slope = np.cumsum(np.bincount(where, event_slopes, len(unique)))
    ramp = np.concatenate([[0.0], slope[:-1] * np.diff(unique)])
    after = np.maximum(np.cumsum(jump + ramp), 0.0)
    before = np.maximum(after - jump, 0.0)
    concurrency = np.cumsum(np.bincount(where, event_count, len(unique))).astype(np.int64)
    return Curve(unique, after, before, concurrency)
