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

CHUNK_POINTS = 4  # chunk-timed progress is followed through this many segments per request


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
    return Timings(
        arrival_ns=np.concatenate([p.arrival_ns for p in parts]),
        ttft_ns=np.concatenate([p.ttft_ns for p in parts]),
        e2e_ns=np.concatenate([p.e2e_ns for p in parts]),
        input_tokens=np.concatenate([p.input_tokens for p in parts]),
        output_tokens=np.concatenate([p.output_tokens for p in parts]),
        chunk_gaps_us=np.concatenate([p.chunk_gaps_us for p in parts]),
        chunk_index=_join_index([p.chunk_index for p in parts]),
        chunk_tokens=np.concatenate([p.chunk_tokens for p in parts if p.chunk_tokens is not None]),
        chunk_tokens_index=_join_index(
            [p.chunk_tokens_index for p in parts if p.chunk_tokens_index is not None]
        ),
    )


def _result_timings(f: ResultFile, shift_ns: int) -> Timings:
    """Usage counts where the target reported them, else the trace's; failures keep what streamed."""
    col = f.column
    gaps, gaps_index = f.ragged("chunk_gaps_us")
    tokens, tokens_index = f.ragged("chunk_tokens")
    cum = np.concatenate([[0], np.cumsum(tokens, dtype=np.int64)])
    streamed = cum[tokens_index[1:]] - cum[tokens_index[:-1]]
    failed_output = np.where(streamed > 0, streamed, col("content_chunks"))
    expected = np.where(col("error") == "", col("expected_output_tokens"), failed_output)
    return Timings(
        arrival_ns=(col("sent_ns") + shift_ns).astype(np.int64),
        ttft_ns=col("ttft_ns").astype(np.int64),
        e2e_ns=col("e2e_ns").astype(np.int64),
        input_tokens=np.where(
            col("prompt_tokens") >= 0, col("prompt_tokens"), col("expected_input_tokens")
        ).astype(np.int64),
        output_tokens=np.where(col("completion_tokens") >= 0, col("completion_tokens"), expected).astype(
            np.int64
        ),
        chunk_gaps_us=gaps.astype(np.int64),
        chunk_index=gaps_index,
        chunk_tokens=tokens.astype(np.int64),
        chunk_tokens_index=tokens_index,
    )


def _join_index(indexes: list[np.ndarray]) -> np.ndarray:
    """Concatenate ragged index arrays (each starting at 0) into one over the concatenated values."""
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


def _progress(t: Timings, points: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(times ns, tokens generated so far) at moments of each request that got a first token.

    Requests with chunk gaps are followed through `points` + 1 chunk arrivals spread evenly over
    their chunks, tokens following the chunks (their reported sizes, else equal shares); the
    others are linear from the first token (one token) to the end (all of them).
    """
    started = t.ttft_ns >= 0
    first = t.arrival_ns + t.ttft_ns
    end = np.maximum(t.arrival_ns + t.e2e_ns, first)
    out = t.output_tokens.astype(np.float64)
    gaps = np.diff(t.chunk_index)
    chunked = started & (gaps > 0)
    linear = np.flatnonzero(started & ~chunked)
    one = np.minimum(out[linear], 1.0)
    groups = [(np.stack([first[linear], end[linear]], axis=1), np.stack([one, out[linear]], axis=1))]
    rows = np.flatnonzero(chunked)
    if len(rows):
        g = gaps[rows][:, None]
        j = (np.arange(points + 1) * g) // points  # chunk numbers 0..g of each row's moments
        cum_us = np.concatenate([[0], np.cumsum(t.chunk_gaps_us)])
        base = t.chunk_index[rows][:, None]
        times = np.minimum(
            first[rows][:, None] + (cum_us[base + j] - cum_us[base]) * 1000, end[rows][:, None]
        )
        groups.append((times, _chunk_fraction(t, rows, j, g) * out[rows][:, None]))
    return groups


def _chunk_fraction(t: Timings, rows: np.ndarray, j: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Fraction of the output present after chunk j: reported chunk sizes where they add up, else equal."""
    equal: np.ndarray = (j + 1) / (g + 1)
    if t.chunk_tokens is None or t.chunk_tokens_index is None or not len(t.chunk_tokens):
        return equal
    index = t.chunk_tokens_index
    counts = np.diff(index)[rows][:, None]
    cum = np.concatenate([[0], np.cumsum(t.chunk_tokens, dtype=np.int64)])
    base = index[rows][:, None]
    total = cum[base + counts] - cum[base]
    usable = (counts == g + 1) & (total > 0)
    reported = (cum[base + np.minimum(j + 1, counts)] - cum[base]) / np.maximum(total, 1)
    fraction: np.ndarray = np.where(usable, reported, equal)
    return fraction


def _point_events(times: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flattened (time, jump, slope change) events of piecewise-linear progress rows."""
    dt = np.diff(times, axis=1)
    d_tokens = np.diff(tokens, axis=1)
    ramps = dt > 0
    slopes = np.zeros(dt.shape)
    np.divide(d_tokens, dt, out=slopes, where=ramps)
    jumps = np.concatenate([tokens[:, :1], np.where(ramps, 0.0, d_tokens)], axis=1)
    zero = np.zeros((len(slopes), 1))
    changes = np.concatenate([slopes, zero], axis=1) - np.concatenate([zero, slopes], axis=1)
    return times.ravel(), jumps.ravel(), changes.ravel()


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
        return _time_at_or_below(*self._segments(), level)

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
        """The level the resident tokens stay at or below for a fraction q of the time (bisection).

        Segments entirely below the bracket count fully, those above it not at all, so each step
        only looks at the segments that straddle it.
        """
        dt, v0, v1 = self._segments()
        target, low, high = q * float(dt.sum()), 0.0, self.peak()[0]
        settled = 0.0
        while high - low > 1e-3 and len(dt):
            mid = (low + high) / 2
            if settled + _time_at_or_below(dt, v0, v1, mid) >= target:
                high = mid
                keep = v0 < high  # v0 <= v1: a segment starting at or above the bracket never counts
            else:
                low = mid
                below = v1 <= low
                settled += float(dt[below].sum())
                keep = ~below
            dt, v0, v1 = dt[keep], v0[keep], v1[keep]
        return high


def _time_at_or_below(dt: np.ndarray, v0: np.ndarray, v1: np.ndarray, level: float) -> float:
    rise = v1 - v0  # never negative beyond rounding: generation only adds tokens
    ramp = np.clip((level - v0) / np.maximum(rise, 1e-9), 0.0, 1.0)
    frac = np.where(rise > 1e-9, ramp, v0 <= level)
    return float(np.dot(dt, frac))


def residency(t: Timings, points: int = CHUNK_POINTS) -> Curve:
    """The event sweep: per-request jumps and slope changes, summed by time with cumulative sums."""
    n = len(t.arrival_ns)
    inputs = t.input_tokens.astype(np.float64)
    started = t.ttft_ns >= 0
    end = np.maximum(t.arrival_ns + t.e2e_ns, t.arrival_ns + np.maximum(t.ttft_ns, 0))
    holds = ((inputs + t.output_tokens) > 0).astype(np.float64)
    freed = inputs + np.where(started, t.output_tokens, 0)
    events = [(t.arrival_ns, inputs, np.zeros(n), holds), (end, -freed, np.zeros(n), -holds)]
    for times, tokens in _progress(t, points):
        ev_times, ev_jumps, ev_slopes = _point_events(times, tokens)
        events.append((ev_times, ev_jumps, ev_slopes, np.zeros(len(ev_times))))
    ev_times, ev_jumps, ev_slopes, ev_counts = (
        np.concatenate(column) for column in zip(*events, strict=True)
    )
    order = np.argsort(ev_times)  # events at one time are summed, so their order does not matter
    ev_times = ev_times[order]
    starts = np.flatnonzero(np.concatenate([[True], ev_times[1:] != ev_times[:-1]]))
    unique = ev_times[starts]
    jump = np.add.reduceat(ev_jumps[order], starts) if len(starts) else np.zeros(0)
    slope = np.cumsum(np.add.reduceat(ev_slopes[order], starts)) if len(starts) else np.zeros(0)
    counts = np.cumsum(np.add.reduceat(ev_counts[order], starts)) if len(starts) else np.zeros(0)
    ramp = np.concatenate([[0.0], slope[:-1] * np.diff(unique)])[: len(unique)]
    after = np.cumsum(jump + ramp)
    before = after - jump
    return Curve(unique, np.maximum(after, 0.0), np.maximum(before, 0.0), np.rint(counts).astype(np.int64))


@dataclass(frozen=True, slots=True)
class TraceFit:
    """A workload's KV residency against a plan's KV cache (all replicas together)."""

    requests: int
    estimated: int  # ends estimated from --assume-ttft-ms / --assume-tpot-ms
    skipped: int  # no token counts: left out
    chunk_timed: int  # followed through recorded chunk times
    duration_s: float
    peak_tokens: float
    peak_at_s: float  # times are seconds after the first request's arrival (send)
    p95_tokens: float
    mean_tokens: float
    peak_concurrency: int
    longest_request_tokens: int
    capacity_tokens: int
    time_over_s: float
    first_over_s: float | None

    @property
    def fits(self) -> bool:
        return self.peak_tokens <= self.capacity_tokens


def fit(
    t: Timings, estimated: int, skipped: int, capacity_tokens: int, points: int = CHUNK_POINTS
) -> TraceFit:
    """Sweep the timings and compare the resident tokens with `capacity_tokens`."""
    curve = residency(t, points)
    peak, peak_at = curve.peak()
    origin = int(curve.times_ns[0]) if len(curve.times_ns) else 0
    first_over = curve.first_above_ns(capacity_tokens)
    return TraceFit(
        requests=len(t.arrival_ns) - skipped,
        estimated=estimated,
        skipped=skipped,
        chunk_timed=int(np.count_nonzero((np.diff(t.chunk_index) > 0) & (t.ttft_ns >= 0))),
        duration_s=curve.duration_ns / 1e9,
        peak_tokens=peak,
        peak_at_s=(peak_at - origin) / 1e9,
        p95_tokens=curve.quantile(0.95),
        mean_tokens=curve.mean(),
        peak_concurrency=int(curve.concurrency.max()) if len(curve.concurrency) else 0,
        longest_request_tokens=int(np.max(t.input_tokens + t.output_tokens, initial=0)),
        capacity_tokens=capacity_tokens,
        time_over_s=curve.time_above_ns(capacity_tokens) / 1e9,
        first_over_s=None if first_over is None else (first_over - origin) / 1e9,
    )
