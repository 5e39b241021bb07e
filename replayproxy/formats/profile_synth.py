"""Sampling a workload profile into request shapes: `synth --profile` ("what if traffic doubles?").

Arrivals: the profile's runs of rate-normalized gaps resampled (older profiles: a gamma renewal
process with the profile's shape), run in the profile's time-changed
clock (its rate series, tiled to the duration asked for, times --rate-scale), so both the rate
over time and the burstiness around it carry over. Lengths: the rank grid picks a cell, the
quantile tables map it to tokens (times --length-scale). Prefixes: a request joins a big group
(by share) or an open small group (as many open as the profile had, times the rate scale); its
reused leading blocks follow the profile's fractions, taken from one of the group's recent
prompts; session follow-up turns reuse their previous turn's whole prompt. docs/formats.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from replayproxy.errors import BadInputFile, BadOption, user_file
from replayproxy.formats.profile_fit import FORMAT, VERSION
from replayproxy.shape import RequestShape, endpoint_named
from replayproxy.trace import TraceHeader

_MASK = (1 << 64) - 1
SYNTH_HASH_SCHEME = "splitmix64-synth-v1"
RECENT_PROMPTS = 64  # prompts per group a new member may extend
FIT_TRIES = 8  # open small groups looked at for one with a prompt long enough for a new member


def load_profile(path: str | Path) -> dict[str, Any]:
    """Read and check a profile file (ValueError with the reason when it is not one)."""
    try:
        with user_file(path):
            profile = orjson.loads(Path(path).read_bytes())
    except orjson.JSONDecodeError as e:
        raise BadInputFile(f"{path}: not a JSON profile ({e})") from e
    if not isinstance(profile, dict) or profile.get("format") != FORMAT:
        raise BadInputFile(
            f"{path}: not a replayproxy profile (export one with `replayproxy export --format profile`)"
        )
    if int(profile.get("version", 0)) > VERSION:
        raise BadInputFile(
            f"{path}: profile version {profile['version']} is newer than this replayproxy ({VERSION})"
        )
    return profile


def shapes_from_profile(
    profile: dict[str, Any],
    *,
    rate_scale: float = 1.0,
    length_scale: float = 1.0,
    duration_s: float | None = None,
    seed: int = 0,
) -> Iterator[RequestShape]:
    """Request shapes in arrival order with the profile's statistics, scaled as asked."""
    if rate_scale <= 0 or length_scale <= 0:
        raise BadOption("--rate-scale and --length-scale must be positive")
    rng = np.random.default_rng(seed)
    times = arrival_times(profile["arrivals"], rate_scale, duration_s or profile["duration_s"], rng)
    inputs, outputs = sample_lengths(profile["lengths"], len(times), rng)
    inputs = np.rint(inputs * length_scale).astype(np.int64)
    outputs = np.maximum(np.rint(outputs * length_scale), 1).astype(np.int64)
    prefixes = _Prefixes(profile, rate_scale, rng)
    sessions = _Sessions(profile.get("sessions", {}), rate_scale, rng)
    models, endpoints = (_choices(profile["mix"][k], len(times), rng) for k in ("model", "endpoint"))
    streams = rng.random(len(times)) < profile["mix"].get("stream", 1.0)
    try:
        endpoint_of = {name: endpoint_named(name) for name in set(map(str, endpoints))}
    except ValueError as e:
        raise BadInputFile(f"profile mix: {e}") from e
    for i, t in enumerate(times.tolist()):
        session, turn = sessions.next()
        hashes = prefixes.next(int(inputs[i]), session if turn else 0)
        yield RequestShape(
            offset_ns=round(t * 1e9),
            endpoint=endpoint_of[str(endpoints[i])],
            model=str(models[i]),
            stream=bool(streams[i]),
            input_tokens=int(inputs[i]),
            output_tokens=int(outputs[i]),
            prefix_hashes=hashes,
            prefix_units=int(inputs[i]) if prefixes.block_size else -1,
            status=200,
            session=session,
            turn=turn,
        )


def profile_header(profile: dict[str, Any]) -> TraceHeader:
    """The header of a trace synthesized from `profile` (token blocks; hashes are not keyed text hashes)."""
    return TraceHeader(
        start_wall_ns=0,
        source="synth:profile",
        block_size=block_size_of(profile),
        block_unit="token",
        hash_scheme=SYNTH_HASH_SCHEME,
        extra={"profile_requests": profile.get("requests"), "profile_duration_s": profile.get("duration_s")},
    )


def block_size_of(profile: dict[str, Any]) -> int:
    """Token block size of the synthesized hashes (a char-unit source is re-expressed as 16 tokens)."""
    block = profile["block"]
    return int(block["size"]) if block["unit"] == "token" else 16


def arrival_times(
    arrivals: dict[str, Any], rate_scale: float, duration_s: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival offsets (s) over [0, duration_s): the source's gap runs (or gamma gaps) in the rate
    series' time-changed clock."""
    rates = np.asarray(arrivals["rate_per_s"], np.float64) * rate_scale
    window = float(arrivals["window_s"])
    if not len(rates) or rates.sum() <= 0 or duration_s <= 0:
        return np.zeros(1 if len(rates) else 0)
    windows = int(np.ceil(duration_s / window))
    tiled = np.resize(rates, windows)
    edges = np.minimum(np.arange(windows + 1) * window, duration_s)
    expected = np.concatenate([[0.0], np.cumsum(tiled * np.diff(edges))])
    shape = float(arrivals["gamma_shape"])
    total = expected[-1]
    wanted = int(total * 1.2 + 10 * np.sqrt(total) / min(shape, 1.0) + 16)
    runs = [np.asarray(run, np.float64) for run in arrivals.get("gap_runs", []) if len(run)]
    if runs and sum(float(run.sum()) for run in runs) > 0:  # the source's gaps in their own order
        picked: list[np.ndarray] = []
        while sum(map(len, picked)) < wanted:
            picked += [runs[i] for i in rng.integers(len(runs), size=max(1, wanted // len(runs[0])))]
        draws = np.concatenate(picked)
        draws /= draws.mean()
    else:  # profiles without runs: a gamma renewal process with the fitted shape
        draws = rng.gamma(shape, 1 / shape, wanted)
    clock = np.cumsum(draws) - draws[0] * rng.random()  # a random phase, so t=0 is not always an arrival
    clock = clock[(clock >= 0) & (clock < total)]
    return np.interp(clock, expected, edges)  # type: ignore[no-any-return]


def sample_lengths(
    lengths: dict[str, Any], n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(input, output) tokens: a rank-grid cell by its count, uniform ranks in it, inverse CDFs."""
    grid = np.asarray(lengths["rank_grid"], np.float64)
    bins = grid.shape[0]
    weights = grid.ravel() / grid.sum() if grid.sum() else np.full(grid.size, 1 / grid.size)
    cell = rng.choice(grid.size, size=n, p=weights)
    u = (cell // bins + rng.random(n)) / bins
    v = (cell % bins + rng.random(n)) / bins
    return _inverse(lengths["input_tokens"], u), _inverse(lengths["output_tokens"], v)


def _inverse(table: list[float], u: np.ndarray) -> np.ndarray:
    if not table:
        return np.zeros(len(u))
    return np.interp(u, np.linspace(0, 1, len(table)), table)  # type: ignore[no-any-return]


def _choices(shares: dict[str, float], n: int, rng: np.random.Generator) -> np.ndarray:
    names = list(shares) or [""]
    p = np.asarray(list(shares.values()) or [1.0], np.float64)
    return rng.choice(np.asarray(names, object), size=n, p=p / p.sum())


def _mix64(previous: int, value: int) -> int:
    z = (previous * 0x9E3779B97F4A7C15 + value) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


@dataclass
class _Group:
    remaining: int  # members still to come (big groups: unbounded)
    recent: list[tuple[int, ...]] = field(default_factory=list)


class _Prefixes:
    """Prefix-block hashes per request, following the profile's group and reuse structure."""

    def __init__(self, profile: dict[str, Any], rate_scale: float, rng: np.random.Generator) -> None:
        prefix = profile.get("prefix", {})
        self.block_size = block_size_of(profile) if prefix.get("with_blocks") else 0
        self.rng = rng
        self.big = [_Group(-1) for _ in prefix.get("big_groups", [])]
        self.big_shares = np.asarray(prefix.get("big_groups", []), np.float64)
        sizes, counts = prefix.get("small_sizes", []), np.asarray(prefix.get("small_counts", []), np.float64)
        self.small_sizes = np.asarray(sizes or [1], np.int64)
        self.small_p = counts / counts.sum() if len(counts) and counts.sum() else np.ones(1)
        self.open_target = max(1, round(prefix.get("concurrent_small", 0) * rate_scale))
        self.open: list[_Group] = []
        self.reuse_edges = prefix.get("reuse_edges", [])
        self.reuse_tables = prefix.get("reuse_quantiles", [])
        self.fresh = int(rng.integers(1, 1 << 62))
        self.last_by_session: dict[int, tuple[int, ...]] = {}

    def next(self, input_tokens: int, session: int) -> tuple[int, ...]:
        blocks = input_tokens // self.block_size if self.block_size else 0
        if session and session in self.last_by_session:  # a follow-up turn extends its previous prompt
            base = self.last_by_session[session]
            hashes = self._extend(base[: min(len(base), blocks)], blocks)
        elif blocks:
            want = self._wanted(blocks)
            group = self._group(want)
            hashes = self._extend(self._reused(group, blocks, want), blocks)
            group.recent = [*group.recent[-(RECENT_PROMPTS - 1) :], hashes]
        else:
            hashes = ()
        if session:
            self.last_by_session[session] = hashes
        return hashes

    def _group(self, want: int) -> _Group:
        u = self.rng.random()
        if len(self.big) and u < self.big_shares.sum():
            return self.big[int(np.searchsorted(np.cumsum(self.big_shares), u, side="right"))]
        if len(self.open) < self.open_target or not self.open:
            group = _Group(int(self.rng.choice(self.small_sizes, p=self.small_p)))
            if group.remaining > 1:
                self.open.append(group)
        else:
            group = self._fitting(want)
        group.remaining -= 1
        if group.remaining == 0 and group in self.open:
            self.open.remove(group)
        return group

    def _wanted(self, blocks: int) -> int:
        """Leading blocks a joining member reuses: the profile's fraction for its length (at least 1)."""
        table = (
            self.reuse_tables[int(np.searchsorted(self.reuse_edges, blocks, side="right"))]
            if self.reuse_tables
            else []
        )
        fraction = float(np.interp(self.rng.random(), np.linspace(0, 1, len(table)), table)) if table else 0.0
        return max(1, round(fraction * blocks))  # members share at least the first block: the group's key

    def _fitting(self, want: int) -> _Group:
        """An open small group with a prompt of at least `want` blocks, of a few drawn at random.

        Lengths are drawn independently of groups; in a real trace a member shares a prefix that the
        group's earlier prompts have. Joining a group whose prompts are all shorter caps the reuse,
        which lost a third of it on traces whose sharing is spread over many small groups.
        """
        best = self.open[int(self.rng.integers(len(self.open)))]
        for _ in range(FIT_TRIES):
            if max(map(len, best.recent), default=0) >= want:
                break
            group = self.open[int(self.rng.integers(len(self.open)))]
            best = max(best, group, key=lambda g: max(map(len, g.recent), default=0))
        return best

    def _reused(self, group: _Group, blocks: int, want: int) -> tuple[int, ...]:
        """Leading hashes taken from one of the group's recent prompts (none for its first member)."""
        if not group.recent:
            return ()
        long_enough = [p for p in group.recent if len(p) >= want]
        source = (
            long_enough[int(self.rng.integers(len(long_enough)))]
            if long_enough
            else max(group.recent, key=len)
        )
        return source[: min(want, blocks)]

    def _extend(self, base: tuple[int, ...], blocks: int) -> tuple[int, ...]:
        hashes = list(base)
        previous = hashes[-1] if hashes else 0
        while len(hashes) < blocks:
            self.fresh += 1
            previous = _mix64(previous, self.fresh)
            hashes.append(previous)
        return tuple(hashes)


class _Sessions:
    """Session and turn per request: as many sessions open at once as the profile had (scaled)."""

    def __init__(self, sessions: dict[str, Any], rate_scale: float, rng: np.random.Generator) -> None:
        counts = np.asarray(sessions.get("turn_counts", []), np.float64)
        self.share = float(sessions.get("share", 0.0))
        self.sizes = np.asarray(sessions.get("turn_sizes", []) or [1], np.int64)
        self.p = counts / counts.sum() if len(counts) and counts.sum() else np.ones(1)
        self.open_target = max(1, round(float(sessions.get("concurrent", 0.0)) * rate_scale))
        self.open: list[list[int]] = []  # [session id, next turn, turns left]
        self.rng = rng

    def next(self) -> tuple[int, int]:
        if not self.share or self.rng.random() >= self.share:
            return 0, 0
        if len(self.open) < self.open_target or not self.open:
            entry = [int(self.rng.integers(1, 1 << 63)), 0, int(self.rng.choice(self.sizes, p=self.p))]
            self.open.append(entry)
        else:
            entry = self.open[int(self.rng.integers(len(self.open)))]
        session, turn = entry[0], entry[1]
        entry[1] += 1
        entry[2] -= 1
        if entry[2] <= 0:
            self.open.remove(entry)
        return session, turn
