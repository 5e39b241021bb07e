"""The measurement contract (DESIGN.md) in code: per-request TTFT, TPOT, ITL, E2E, lag, concurrency.

Input is `Requests` (columns of one run, from a result file or from a trace's production timings);
output is `Measures`, float arrays in ms with NaN where a figure was not measured. Latency figures
cover successful requests only; each statistic carries its count, and errors are counted by class
beside them (never silently dropped).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _unknown() -> np.ndarray:
    return np.zeros(0, np.int64)


NS_PER_MS = 1e6
NS_PER_S = 1e9


@dataclass(slots=True)
class Requests:
    """Per-request columns of one run; -1 means unknown (as in ReplayResult / RequestShape)."""

    index: np.ndarray  # position in the trace (pairs runs of one trace)
    scheduled_ns: np.ndarray  # relative to the run start; -1 when the run had no schedule
    sent_ns: np.ndarray  # relative to the run start
    endpoint: np.ndarray  # object: "chat", "completions", ...
    stream: np.ndarray  # bool
    error: np.ndarray  # object: shape.ERROR_CLASSES, "" = success
    ttft_ns: np.ndarray  # from the send
    e2e_ns: np.ndarray  # from the send
    gaps_us: np.ndarray  # flat gaps between content chunks after the first
    gap_index: np.ndarray  # request i's gaps: gaps_us[gap_index[i]:gap_index[i + 1]]
    chunk_tokens: np.ndarray  # flat tokens per content chunk (may be empty)
    token_index: np.ndarray
    content_chunks: np.ndarray
    input_tokens: np.ndarray  # measured (usage) where known, else expected; -1 unknown
    output_tokens: np.ndarray  # from usage; -1 unknown
    expected_input_tokens: np.ndarray  # what the trace asked for; -1 unknown
    expected_output_tokens: np.ndarray
    # prompt prefix an earlier request of the trace had, tokens; empty when the run did not record it
    expected_shared_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # sessions (report.sessions); empty when the run's file has no session columns
    session: np.ndarray = field(default_factory=_unknown)  # uint64 session id, 0 = none
    after: np.ndarray = field(default_factory=_unknown)  # trace index of the turn it followed, -1 none
    think_ns: np.ndarray = field(default_factory=_unknown)  # think time it should have had, -1 unknown
    # prompt tokens the engine's reply said it served from its cache (usage), -1 unknown
    cached_tokens: np.ndarray = field(default_factory=_unknown)
    turn: np.ndarray = field(default_factory=_unknown)  # depth in the session graph; empty: not recorded

    def __len__(self) -> int:
        return len(self.index)

    def subset(self, keep: np.ndarray) -> Requests:
        """The requests where `keep` is true, ragged columns included."""
        gaps, gap_index = _ragged_subset(self.gaps_us, self.gap_index, keep)
        tokens, token_index = _ragged_subset(self.chunk_tokens, self.token_index, keep)
        plain = {
            name: getattr(self, name)[keep]
            for name in self.__dataclass_fields__
            if name not in ("gaps_us", "gap_index", "chunk_tokens", "token_index")
        }
        return Requests(
            gaps_us=gaps, gap_index=gap_index, chunk_tokens=tokens, token_index=token_index, **plain
        )


def _ragged_subset(flat: np.ndarray, index: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.diff(index)
    values = flat[np.repeat(keep, lengths)] if len(flat) else flat
    return values, np.concatenate([[0], np.cumsum(lengths[keep])]).astype(np.int64)


@dataclass(slots=True)
class Measures:
    """Everything the report computes per request, aligned with Requests (ms; NaN = not measured)."""

    requests: Requests
    ok: np.ndarray  # bool: no error
    input_tokens: np.ndarray  # float, NaN unknown
    output_tokens: np.ndarray  # float: usage, else sum of chunk tokens, else content chunks
    output_from_usage: np.ndarray  # bool
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2e_ms: np.ndarray
    lag_ms: np.ndarray  # actual send - scheduled send
    ttft_sched_ms: np.ndarray  # TTFT counted from the scheduled time (coordinated omission)
    e2e_sched_ms: np.ndarray
    itl_ms: np.ndarray  # flat, successful requests only
    itl_owner: np.ndarray  # request position of each itl_ms value
    itl_per_token: bool  # whether any gap was split per token (chunk_tokens present)
    start_s: np.ndarray  # send time, s after the run's first send
    end_s: np.ndarray  # end of the response (start_s when it never ended)
    duration_s: float  # first send -> last end

    @property
    def n(self) -> int:
        return len(self.ok)


def measure(req: Requests) -> Measures:
    """Compute the contract's figures for every request of one run."""
    ok = req.error == ""
    n = len(req)
    ttft = np.where(ok & (req.ttft_ns >= 0), req.ttft_ns / NS_PER_MS, np.nan)
    e2e = np.where(ok & (req.e2e_ns >= 0), req.e2e_ns / NS_PER_MS, np.nan)
    out_tokens, from_usage = _output_tokens(req)
    # TPOT = (E2E - TTFT) / (output_tokens - 1): the decode time per token after the first. Only a
    # streaming reply has a first token apart from the last; a whole-body reply has no TPOT.
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(req.stream.astype(bool) & (out_tokens >= 2), (e2e - ttft) / (out_tokens - 1), np.nan)
    scheduled = req.scheduled_ns >= 0
    lag = np.where(scheduled & (req.sent_ns >= 0), (req.sent_ns - req.scheduled_ns) / NS_PER_MS, np.nan)
    lag_or_zero = np.nan_to_num(lag, nan=0.0)
    itl, owner, per_token = _itl(req, ok)
    sent = req.sent_ns.astype(np.float64)
    first = float(sent.min()) if n else 0.0
    start_s = (sent - first) / NS_PER_S
    end_s = start_s + np.maximum(req.e2e_ns, 0) / NS_PER_S
    duration = float(end_s.max()) if n else 0.0
    return Measures(
        requests=req,
        ok=ok,
        input_tokens=np.where(req.input_tokens >= 0, req.input_tokens, np.nan).astype(np.float64),
        output_tokens=out_tokens,
        output_from_usage=from_usage,
        ttft_ms=ttft,
        tpot_ms=tpot,
        e2e_ms=e2e,
        lag_ms=lag,
        ttft_sched_ms=np.where(scheduled, ttft + lag_or_zero, np.nan),
        e2e_sched_ms=np.where(scheduled, e2e + lag_or_zero, np.nan),
        itl_ms=itl,
        itl_owner=owner,
        itl_per_token=per_token,
        start_s=start_s,
        end_s=end_s,
        duration_s=duration,
    )


def _output_tokens(req: Requests) -> tuple[np.ndarray, np.ndarray]:
    """Output tokens per request: usage when present, else summed chunk tokens, else chunk count."""
    lengths = np.diff(req.token_index)
    owner = np.repeat(np.arange(len(req), dtype=np.int64), lengths)
    summed = np.bincount(owner, weights=req.chunk_tokens.astype(np.float64), minlength=len(req))
    from_chunks = np.where(lengths > 0, summed, req.content_chunks).astype(np.float64)
    from_usage = req.output_tokens >= 0
    out = np.where(from_usage, req.output_tokens, from_chunks).astype(np.float64)
    out[out < 0] = np.nan
    return out, from_usage


def _itl(req: Requests, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Inter-token latencies of successful requests, pooled over all gaps.

    Without per-chunk token counts each gap between content chunks is one value. With them
    (chunk_tokens of a request has one entry per content chunk), a chunk of k tokens arriving g after
    the previous one contributes k values of g / k: its tokens are taken to have been produced
    evenly over the gap, so the values sum to the decode time and count one per token. The first
    chunk's tokens belong to TTFT and contribute none.
    """
    gap_lengths = np.diff(req.gap_index)
    token_lengths = np.diff(req.token_index)
    keep = np.repeat(ok, gap_lengths)
    gaps_ms = req.gaps_us[keep] / 1e3
    owner = np.repeat(np.arange(len(req), dtype=np.int64)[ok], gap_lengths[ok])
    per_token_rows = (token_lengths == gap_lengths + 1) & (gap_lengths > 0)
    if not per_token_rows.any():
        return gaps_ms, owner, False
    position = np.arange(len(req.gaps_us), dtype=np.int64)[keep] - req.gap_index[owner]
    use = per_token_rows[owner]
    token_pos = np.where(use, req.token_index[owner] + 1 + position, 0)
    tokens = np.where(use, req.chunk_tokens[np.minimum(token_pos, max(len(req.chunk_tokens) - 1, 0))], 1)
    tokens = np.maximum(tokens.astype(np.int64), 1)
    return np.repeat(gaps_ms / tokens, tokens), np.repeat(owner, tokens), True


def concurrency(m: Measures) -> tuple[float, int]:
    """Mean and peak requests in flight over the run, from each request's send and end times."""
    if not m.n:
        return 0.0, 0
    mean = float(np.sum(m.end_s - m.start_s) / m.duration_s) if m.duration_s > 0 else 0.0
    # Sweep line: +1 at each send, -1 at each end; at equal times ends come first (touching ≠ overlap).
    times = np.concatenate([m.end_s, m.start_s])
    steps = np.concatenate([np.full(m.n, -1, np.int64), np.ones(m.n, np.int64)])
    order = np.lexsort((steps, times))
    return mean, int(np.cumsum(steps[order]).max())


def in_flight_series(m: Measures, points: int = 600) -> tuple[np.ndarray, np.ndarray]:
    """(times_s, requests in flight) sampled on an even grid, for plots."""
    grid = np.linspace(0.0, max(m.duration_s, 1e-9), points)
    started = np.searchsorted(np.sort(m.start_s), grid, side="right")
    ended = np.searchsorted(np.sort(m.end_s), grid, side="right")
    return grid, started - ended


def exact_share(measured: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """Share of requests whose measured length equals the trace's, over those where both are known."""
    known = (measured >= 0) & (expected >= 0)
    count = int(known.sum())
    return (float(np.mean(measured[known] == expected[known])) if count else float("nan")), count
