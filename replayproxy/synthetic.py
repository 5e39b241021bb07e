"""Synthetic workloads: realistic request shapes from a few parameters, for tests, benchmarks and demos.

Pure and deterministic: the same `SynthSpec` (seed included) always yields the same shapes. The
arrival process is drawn first (Poisson, or gamma with a chosen CV for bursts); each arrival is then
a single request or the next turn of a multi-turn session. Prompts are pseudo token ids: a group's
shared system prompt, then request-specific ids; a session's next prompt is the previous prompt,
its answer and a new user message. Prefix hashes are `shape.prefix_block_hashes` over those ids.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from replayproxy.errors import BadOption
from replayproxy.shape import BlockHashes, RequestShape, endpoint_named, key_fingerprint, prefix_block_hashes
from replayproxy.trace import TraceHeader

_CHUNK = 65_536  # draws per batch: bounds memory, and fixes the random streams' layout
_ID_STRIDE = 1_000_003  # prime: segment bases never repeat within _ID_SPAN segments
_MAX_SEGMENT = 1 << 21  # longest run of fresh ids (a user message or an answer)
_ID_SPAN = (1 << 32) - _MAX_SEGMENT  # so base + length stays a valid u32 token id


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A token-length distribution: `lognormal:mean=M,sigma=S[,min=A][,max=B]`, `fixed:N`, `uniform:A,B`."""

    kind: str
    mean: float = 0.0  # lognormal: the mean of the distribution (not of its log)
    sigma: float = 0.0  # lognormal: standard deviation of log(length)
    low: int = 1  # fixed: the value; uniform: inclusive bounds; lognormal: clip bounds
    high: int = 1 << 20

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        kind, _, rest = text.partition(":")
        try:
            if kind == "fixed":
                value = int(rest)
                dist = cls("fixed", low=value, high=value)
            elif kind == "uniform":
                low, high = (int(v) for v in rest.split(","))
                dist = cls("uniform", low=low, high=high)
            elif kind == "lognormal":
                params = {k.strip(): float(v) for k, v in (p.split("=") for p in rest.split(","))}
                unknown = set(params) - {"mean", "sigma", "min", "max"}
                if unknown or "mean" not in params:
                    raise BadOption(
                        f"lognormal takes mean=, sigma=, min=, max= (mean required), got {rest!r}"
                    )
                dist = cls(
                    "lognormal",
                    mean=params["mean"],
                    sigma=params.get("sigma", 0.8),
                    low=int(params.get("min", 1)),
                    high=int(params.get("max", 1 << 20)),
                )
            else:
                raise BadOption(f"unknown distribution {kind!r}; use lognormal, fixed or uniform")
        except ValueError as e:
            raise BadOption(f"bad length distribution {text!r}: {e}") from e
        dist.check()
        return dist

    def check(self) -> None:
        if not 1 <= self.low <= self.high:
            raise BadOption(f"length bounds must satisfy 1 <= low <= high, got {self.low}, {self.high}")
        if self.kind == "lognormal" and not (self.mean >= 1 and self.sigma >= 0):
            raise BadOption(f"lognormal needs mean >= 1 and sigma >= 0, got {self.mean}, {self.sigma}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.low, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)
        mu = math.log(self.mean) - self.sigma**2 / 2  # so that E[length] = mean
        return np.clip(np.rint(rng.lognormal(mu, self.sigma, n)), self.low, self.high).astype(np.int64)

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.low}"
        if self.kind == "uniform":
            return f"uniform:{self.low},{self.high}"
        return f"lognormal:mean={self.mean:g},sigma={self.sigma:g},min={self.low},max={self.high}"


def parse_arrival(text: str) -> float:
    """`poisson` or `gamma:CV` as the inter-arrival coefficient of variation (Poisson is CV 1)."""
    if text == "poisson":
        return 1.0
    kind, _, value = text.partition(":")
    try:
        cv = float(value) if kind == "gamma" else math.nan
    except ValueError:
        cv = math.nan
    if not cv > 0:
        raise BadOption(
            f"bad arrival process {text!r}; use poisson or gamma:CV with CV > 0 (CV > 1 is bursty)"
        )
    return cv


@dataclass(frozen=True, slots=True)
class SynthSpec:
    """Everything a synthetic trace depends on; lengths in tokens, rate in requests per second."""

    requests: int | None = None  # stop after this many requests...
    duration_s: float | None = None  # ...or at this offset; 1000 requests when neither is given
    rate_rps: float = 10.0
    arrival_cv: float = 1.0  # inter-arrival coefficient of variation: 1 = Poisson, > 1 = bursts
    input_len: LengthDist = field(default_factory=lambda: LengthDist("lognormal", mean=1000, sigma=0.8))
    output_len: LengthDist = field(default_factory=lambda: LengthDist("lognormal", mean=250, sigma=0.8))
    prefix_groups: int = 0  # shared system prompts; group g is chosen with weight 1/(g+1)
    prefix_len_tokens: int = 0  # length of each group's system prompt
    sessions_share: float = 0.0  # share of requests that belong to multi-turn sessions
    turns: LengthDist = field(default_factory=lambda: LengthDist("uniform", low=2, high=6))
    think_s: float = 5.0  # mean pause between a turn's answer and the next turn
    endpoint: str = "chat"
    stream_share: float = 1.0
    model: str = "synth"
    seed: int = 0
    block_size: int = 16
    context_tokens: int = 32_768  # a session ends before a prompt would exceed this

    def __post_init__(self) -> None:
        if self.requests is not None and self.duration_s is not None:
            raise BadOption("give the number of requests or the duration, not both")
        if (self.requests is not None and self.requests < 0) or (
            self.duration_s is not None and not 0 <= self.duration_s < math.inf
        ):
            raise BadOption("requests and duration must be finite and not negative")
        if not 0 < self.rate_rps < math.inf or not 0 < self.arrival_cv < math.inf:
            raise BadOption(
                f"rate and arrival CV must be positive and finite, got {self.rate_rps}, {self.arrival_cv}"
            )
        if self.endpoint not in ("chat", "completions"):
            raise BadOption(f"endpoint must be chat or completions, got {self.endpoint!r}")
        for name in ("sessions_share", "stream_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise BadOption(
                    f"{name.replace('_', '-')} must be between 0 and 1, got {getattr(self, name)}"
                )
        if (
            self.prefix_groups < 0
            or self.prefix_len_tokens < 0
            or (self.prefix_groups and not self.prefix_len_tokens)
        ):
            raise BadOption("prefix groups need a positive --prefix-len")
        if self.block_size <= 0 or not 1 <= self.context_tokens <= _MAX_SEGMENT // 2:
            raise BadOption(f"block size must be positive and the context 1..{_MAX_SEGMENT // 2} tokens")
        if self.prefix_len_tokens >= self.context_tokens:
            raise BadOption("the prefix must be shorter than the context")
        for dist in (self.input_len, self.output_len, self.turns):
            dist.check()

    @property
    def key(self) -> bytes:
        """The per-seed hash key: fixed, so equal seeds give equal hashes and mergeable traces."""
        return hashlib.blake2b(f"replayproxy synth key {self.seed}".encode(), digest_size=32).digest()


def header_for(spec: SynthSpec) -> TraceHeader:
    """The trace header of a synthetic trace: time 0 (1970-01-01) so that same seed means same bytes."""
    return TraceHeader(
        start_wall_ns=0,
        source="synth",
        block_size=spec.block_size,
        block_unit="token",
        key_fingerprint=key_fingerprint(spec.key),
        recorder="replayproxy synth",
        extra={"synth": describe(spec)},
    )


def describe(spec: SynthSpec) -> dict[str, object]:
    return {
        name: str(value) if isinstance(value, LengthDist) else value
        for name in SynthSpec.__dataclass_fields__
        if (value := getattr(spec, name)) is not None
    }


@dataclass(slots=True)
class _Session:
    serial: int  # tie-break in the waiting heap
    ident: int  # the keyed session id written to the trace
    turns_left: int
    tokens: list[int]  # the last prompt's token ids
    hashes: BlockHashes  # its block hashes
    answer_tokens: int  # the last turn's output length
    roles: str
    turn: int = 0


class _Generator:
    """The mutable state of one generation run: random streams, id segments and open sessions."""

    def __init__(self, spec: SynthSpec) -> None:
        self.spec = spec
        streams = np.random.SeedSequence(spec.seed).spawn(8)
        self.rng = [np.random.default_rng(s) for s in streams]
        self.segments = 0
        self.key = spec.key
        self.group_tokens = [self.fresh_ids(spec.prefix_len_tokens) for _ in range(spec.prefix_groups)]
        self.group_hashes = [prefix_block_hashes(t, spec.block_size, self.key) for t in self.group_tokens]
        weights = 1.0 / np.arange(1, spec.prefix_groups + 1)
        self.group_p = weights / weights.sum() if spec.prefix_groups else None
        self.waiting: list[tuple[int, int, _Session]] = []  # (ready offset, tie-break, session) heap
        self.sessions = 0

    def fresh_ids(self, n: int) -> list[int]:
        """`n` pseudo token ids never used before in this trace."""
        base = self.segments * _ID_STRIDE % _ID_SPAN
        self.segments += 1
        return list(range(base, base + n))

    def session_ident(self) -> int:
        self.sessions += 1
        digest = hashlib.blake2b(self.sessions.to_bytes(8, "little"), key=self.key, digest_size=8).digest()
        return int.from_bytes(digest, "little") or 1

    def arrivals(self) -> Iterator[np.ndarray]:
        """Arrival offsets (ns) in chunks: gamma gaps with mean 1/rate and the chosen CV; first at 0."""
        spec = self.spec
        shape = 1.0 / spec.arrival_cv**2
        scale_s = 1.0 / (spec.rate_rps * shape)
        limit = (
            spec.requests if spec.requests is not None else (None if spec.duration_s is not None else 1000)
        )
        produced, clock_s = 0, 0.0
        while limit is None or produced < limit:
            n = _CHUNK if limit is None else min(_CHUNK, limit - produced)
            gaps = self.rng[0].gamma(shape, scale_s, n)
            gaps[0] += clock_s
            if produced == 0:
                gaps[0] = 0.0
            times_s = np.cumsum(gaps)
            clock_s = float(times_s[-1])
            if spec.duration_s is not None:
                times_s = times_s[times_s < spec.duration_s]
            yield np.rint(times_s * 1e9).astype(np.int64)
            produced += n
            if spec.duration_s is not None and len(times_s) < n:
                return

    def run(self) -> Iterator[RequestShape]:
        spec = self.spec
        endpoint = endpoint_named(spec.endpoint)
        for offsets in self.arrivals():
            n = len(offsets)
            inputs = spec.input_len.sample(self.rng[1], n)
            outputs = spec.output_len.sample(self.rng[2], n)
            streams = self.rng[3].random(n) < spec.stream_share
            in_session = self.rng[4].random(n) < spec.sessions_share
            groups = self.rng[5].choice(spec.prefix_groups, n, p=self.group_p) if spec.prefix_groups else None
            turns = spec.turns.sample(self.rng[6], n)
            thinks_ns = self.rng[7].exponential(spec.think_s * 1e9, n)
            for i in range(n):
                group = int(groups[i]) if groups is not None else -1
                offset = int(offsets[i])
                output = int(outputs[i])
                if in_session[i]:
                    session = self.next_turn(offset, int(inputs[i]), group, max(2, int(turns[i])))
                    tokens, hashes, roles = session.tokens, session.hashes, session.roles
                    ident, turn = session.ident, session.turn
                    self.wait(session, offset, output, float(thinks_ns[i]))
                else:
                    tokens, hashes = self.first_prompt(int(inputs[i]), group)
                    roles, ident, turn = self.first_roles(group), 0, 0
                yield RequestShape(
                    offset_ns=offset,
                    endpoint=endpoint,
                    model=spec.model,
                    stream=bool(streams[i]),
                    input_tokens=len(tokens),
                    output_tokens=output,
                    max_tokens=output,
                    roles=roles if spec.endpoint == "chat" else "",
                    prefix_hashes=hashes,
                    prefix_units=len(tokens),
                    session=ident,
                    turn=turn,
                )

    def first_roles(self, group: int) -> str:
        return "su" if group >= 0 else "u"

    def first_prompt(self, length: int, group: int) -> tuple[list[int], BlockHashes]:
        """A group's system prompt (if any) then fresh ids, `length` in all (at least one fresh id)."""
        length = min(length, self.spec.context_tokens)
        if group < 0:
            tokens = self.fresh_ids(length)
            return tokens, prefix_block_hashes(tokens, self.spec.block_size, self.key)
        prefix = self.group_tokens[group]
        tokens = prefix + self.fresh_ids(max(1, length - len(prefix)))
        return tokens, prefix_block_hashes(
            tokens, self.spec.block_size, self.key, known=self.group_hashes[group]
        )

    def next_turn(self, offset: int, user_tokens: int, group: int, turns: int) -> _Session:
        """The oldest session ready for its next turn, extended; else a new session's first turn."""
        while self.waiting and self.waiting[0][0] <= offset:
            _, _, session = heapq.heappop(self.waiting)
            grown = len(session.tokens) + session.answer_tokens + user_tokens
            if grown > self.spec.context_tokens:
                continue  # the conversation would overflow the context: it ends here
            tokens = session.tokens + self.fresh_ids(session.answer_tokens) + self.fresh_ids(user_tokens)
            session.hashes = prefix_block_hashes(tokens, self.spec.block_size, self.key, known=session.hashes)
            session.tokens = tokens
            session.roles += "au"
            session.turn += 1
            session.turns_left -= 1
            return session
        tokens, hashes = self.first_prompt(user_tokens, group)
        ident = self.session_ident()
        return _Session(self.sessions, ident, turns - 1, tokens, hashes, 0, self.first_roles(group))

    def wait(self, session: _Session, offset: int, output_tokens: int, think_ns: float) -> None:
        """Queue the session for its next turn after a rough answer time plus a think pause."""
        if session.turns_left <= 0:
            return
        session.answer_tokens = output_tokens
        ready = offset + int(1e9 + 20e6 * output_tokens + think_ns)
        heapq.heappush(self.waiting, (ready, session.serial, session))


def generate(spec: SynthSpec) -> Iterator[RequestShape]:
    """The shapes of `spec`'s trace in arrival order (lazily: millions of requests fit in memory)."""
    return _Generator(spec).run()
