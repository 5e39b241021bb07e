"""Sweeps: one trace replayed at rising loads; the operating line, its operating point, the --auto search.

A step's load is its offered rate (open loop: speeds or absolute `--rates`) or its concurrency
limit (closed loop: `--concurrency`). Operating-point rule (docs/report.md): steps are taken in load
order and each is compared with the one before. A step *bends* when its p95 TTFT grows more than
the load did (and by over 50 ms) or crosses the SLO, when failures appear (error rate at or above
the threshold), or when its throughput stops growing (achieved req/s grew by less than half of the
load increase). The operating point is the step before the first bend. A bend at the lowest step
means the engine was already saturated there: the sweep asks for lower steps. Under noise a bend
must hold: one that no higher step repeats (a higher load served better, or met the SLO) is read as
noise, and a client-bound step's throughput as the replayer's limit; both are named.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from replayproxy.errors import BadOption
from replayproxy.report import noise
from replayproxy.report.goodput import Goodput, Slo, goodput, pooled_values
from replayproxy.report.measures import concurrency
from replayproxy.report.runs import Run
from replayproxy.report.stats import Summary, summarize
from replayproxy.report.verdict import LAG_WARN_MS

GROWTH_SHARE = 0.5  # of the load increase that must show up as achieved throughput
P95_JUMP_MIN_MS = 50.0
SATURATED_SHARE = 0.8  # achieved below this share of offered at the lowest step: already saturated
MAX_ERROR_RATE = 0.01
ATTAINMENT = 0.9  # share of requests that must meet per-request SLOs for a step to meet the SLO
MAX_RUNS = 8  # replays one --auto search may run
START_SPEED = 1.0  # the first speed a search tries; it doubles from there while the SLO holds


@dataclass(frozen=True, slots=True)
class Step:
    """One sweep step's figures (a row of the sweep table)."""

    speed: float
    label: str
    requests: int
    requests_per_s: float  # successful requests / run duration
    output_tokens_per_s: float
    mean_concurrency: float
    ttft_ms: Summary
    tpot_ms: Summary
    e2e_ms: Summary
    errors: int
    goodput: Goodput | None
    offered_requests_per_s: float = math.nan  # requests / span of scheduled sends
    concurrency_limit: int = 0  # closed loop: requests in flight at most; 0: open loop
    slo_crossed: tuple[str, ...] = ()  # SLO clauses the step's p95 (or percentile check) broke
    duration_s: float = math.nan  # first send -> last end
    lag_p99_ms: float = math.nan  # schedule lag p99: above LAG_WARN_MS the client limited the run

    @property
    def served_requests_per_s(self) -> float:
        """Achieved req/s over the time requests arrived: a run's duration also holds the last
        requests' own latency, which would make a short run look slower than it was offered."""
        busy_s = self.duration_s - (self.e2e_ms.p50 / 1000 if math.isfinite(self.e2e_ms.p50) else 0.0)
        return (self.requests - self.errors) / busy_s if busy_s > 0 else math.nan

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def load(self) -> float:
        """What the sweep raises: the concurrency limit, else the offered rate, else the speed."""
        if self.concurrency_limit:
            return float(self.concurrency_limit)
        return self.offered_requests_per_s if math.isfinite(self.offered_requests_per_s) else self.speed

    @property
    def load_text(self) -> str:
        if self.concurrency_limit:
            return f"concurrency {self.concurrency_limit}"
        if math.isfinite(self.offered_requests_per_s):
            return f"{self.speed:g}x ({self.offered_requests_per_s:.3g} req/s offered)"
        return f"{self.speed:g}x"


def step_of(run: Run, slos: tuple[Slo, ...] = ()) -> Step:
    m = run.measures
    duration = m.duration_s if m.duration_s > 0 else math.nan
    ok_tokens = float(m.output_tokens[m.ok & (m.output_tokens >= 0)].sum())
    scheduled = m.requests.scheduled_ns[m.requests.scheduled_ns >= 0]
    span_s = float(scheduled.max() - scheduled.min()) / 1e9 if len(scheduled) > 1 else 0.0
    cap = run.options.get("max_concurrency")
    g = goodput(m, slos) if slos else None
    return Step(
        speed=run.speed if run.speed is not None else 1.0,
        label=run.label,
        requests=m.n,
        requests_per_s=float(m.ok.sum()) / duration,
        output_tokens_per_s=ok_tokens / duration,
        mean_concurrency=concurrency(m)[0],
        ttft_ms=summarize(m.ttft_ms),
        tpot_ms=summarize(m.tpot_ms),
        e2e_ms=summarize(m.e2e_ms),
        errors=int((~m.ok).sum()),
        goodput=g,
        offered_requests_per_s=len(scheduled) / span_s if span_s > 0 and not cap else math.nan,
        concurrency_limit=int(cap) if isinstance(cap, int) and cap > 0 else 0,
        slo_crossed=_crossed(run, slos, g),
        duration_s=m.duration_s,
        lag_p99_ms=summarize(m.lag_ms).p99,
    )


def _crossed(run: Run, slos: tuple[Slo, ...], g: Goodput | None) -> tuple[str, ...]:
    """Per-request clauses whose p95 is over the limit, and percentile clauses not met."""
    out = []
    for slo in slos:
        if slo.percentile is not None:
            continue
        values = pooled_values(run.measures, slo.metric)
        values = values[np.isfinite(values)]
        p95 = float(np.percentile(values, 95)) if len(values) else math.nan
        if p95 > slo.limit_ms:
            out.append(f"{slo.metric} p95 {p95:.4g} ms > SLO {slo.limit_ms:g} ms")
    if g is not None:
        out.extend(f"{c.slo.text} missed ({c.value_ms:.4g} ms)" for c in g.checks if not c.met)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Knee:
    """The operating point: `step` is the last step before the first bend (`broke_at`)."""

    step: int | None  # index into the load-sorted steps; None: the lowest step already bent
    broke_at: int | None  # the first step that bent; None: no step did
    reasons: tuple[str, ...]  # why broke_at bent
    noise: tuple[str, ...] = ()  # steps whose bend a higher load did not repeat, or client-bound ones

    def describe(self, steps: list[Step]) -> str:
        if self.broke_at is None:
            if not steps:
                return "no steps"
            return (
                f"operating point at the highest step, {steps[-1].load_text}: no step bent; try higher loads"
            )
        why = ", ".join(self.reasons)
        if self.step is None:
            return (
                f"already saturated at the lowest step, {steps[0].load_text} ({why}): "
                "add lower steps (lower --rates, --speeds or --concurrency)"
            )
        which = "the next step" if self.broke_at == self.step + 1 else "the next step that bent"
        broke = steps[self.broke_at].load_text
        return f"operating point at {steps[self.step].load_text}: {which} ({broke}) {why}"


Bend = tuple[str, str]  # (kind: "errors" | "slo" | "throughput" | "latency", in words)


def bends(prev: Step | None, cur: Step, max_error_rate: float = MAX_ERROR_RATE) -> list[Bend]:
    """How `cur` bends against the step before it (None: it is the lowest step)."""
    out: list[Bend] = []
    if cur.error_rate >= max_error_rate:
        out.append(("errors", f"failed {cur.error_rate:.1%} of requests"))
    out.extend(("slo", f"crossed the SLO ({c})") for c in cur.slo_crossed)
    if prev is None:
        offered, served = cur.offered_requests_per_s, cur.served_requests_per_s
        if math.isfinite(offered) and math.isfinite(served) and served < SATURATED_SHARE * offered:
            # In words, the table's achieved figure; the rule discounts the run's own tail (served).
            out.append(("throughput", f"achieved {cur.requests_per_s:.3g} of {offered:.3g} req/s offered"))
        return out
    load = cur.load / prev.load if prev.load > 0 else math.inf
    if cur.requests_per_s < prev.requests_per_s * (1 + GROWTH_SHARE * (load - 1)):
        out.append((
            "throughput",
            f"throughput stopped growing ({prev.requests_per_s:.3g} -> {cur.requests_per_s:.3g} req/s "
            f"for {load:.3g}x the load)",
        ))  # fmt: skip
    before, after = prev.ttft_ms.p95, cur.ttft_ms.p95
    if after > load * before and after - before > P95_JUMP_MIN_MS:
        out.append(("latency", f"p95 TTFT bent ({before:.4g} -> {after:.4g} ms for {load:.3g}x the load)"))
    return out


def _repeats(
    kind: str,
    prev: Step | None,
    cur: Step,
    later: Step,
    max_error_rate: float,
    passes: Callable[[Step], bool] | None,
) -> bool:
    """Whether `later`, at a higher load than `cur`, bends the way `cur` did. A later step that
    meets the SLO repeats no failure, nor the lowest step's shortfall: the engine served more."""
    if passes is not None and passes(later) and (kind in ("errors", "slo") or prev is None):
        return False
    if kind == "errors":
        return later.error_rate >= max_error_rate
    if kind == "slo":
        return bool(later.slo_crossed)
    if kind == "throughput" and prev is None:
        return not later.served_requests_per_s >= SATURATED_SHARE * cur.offered_requests_per_s
    return kind in {k for k, _ in bends(prev, later, max_error_rate)}


def find_knee(
    steps: list[Step],
    max_error_rate: float = MAX_ERROR_RATE,
    passes: Callable[[Step], bool] | None = None,
) -> Knee:
    """Apply the operating-point rule to steps sorted by load, under noise: a client-bound step's
    throughput is the replayer's limit, not a bend; a step whose bend no higher step repeats
    (non-monotone: a higher load served better) is noise, not saturation. `passes`: the SLO's
    pass rule, when there is one."""
    prev: Step | None = None
    noisy: list[str] = []
    prev_i: int | None = None
    for i, cur in enumerate(steps):
        found = bends(prev, cur, max_error_rate)
        if client_bound(cur) and any(kind == "throughput" for kind, _ in found):
            found = [(kind, words) for kind, words in found if kind != "throughput"]
            noisy.append(
                f"{cur.load_text}: client-bound (schedule lag p99 {cur.lag_p99_ms:.3g} ms > "
                f"{LAG_WARN_MS:g} ms): its throughput is the replayer's limit, not read as the engine's"
            )
        if not found:
            prev, prev_i = cur, i
            continue
        kinds = {kind for kind, _ in found}
        higher = next(
            (
                later
                for later in steps[i if prev is None else i + 1 :]  # the lowest step may meet the SLO itself
                if not any(_repeats(k, prev, cur, later, max_error_rate, passes) for k in kinds)
            ),
            None,
        )
        words = ", ".join(w for _, w in found)
        if higher is cur:
            noisy.append(f"{cur.load_text} {words}, but met the SLO: not read as saturation")
        elif higher is not None:
            noisy.append(
                f"{cur.load_text} {words}, but a higher load, {higher.load_text}, did not: "
                "read as noise (non-monotone), not saturation"
            )
        if higher is not None:
            prev, prev_i = cur, i
            continue
        return Knee(prev_i, i, tuple(w for _, w in found), tuple(noisy))
    return Knee(prev_i, None, (), tuple(noisy))


def check_share(option: str, value: float) -> None:
    """Reject a rate or share option outside (0, 1] (NaN included) before any work is done."""
    if not 0 < value <= 1:
        raise BadOption(f"{option} must be in (0, 1], got {value:g}")


def check_search_options(max_runs: int, start_speed: float, max_error_rate: float, attainment: float) -> None:
    """The rate search's own options (sweep --auto and tune share them), refused before any work."""
    if max_runs < 1:
        raise BadOption(f"--max-runs must be at least 1, got {max_runs}")
    if not 0 < start_speed < math.inf:
        raise BadOption(f"--start-speed must be a positive number, got {start_speed:g}")
    check_share("--max-error-rate", max_error_rate)
    check_share("--attainment", attainment)


def meets(step: Step, max_error_rate: float, attainment: float) -> bool:
    """--auto's pass rule: few errors, percentile SLOs met, and enough requests meeting per-request SLOs."""
    if step.error_rate >= max_error_rate:
        return False
    if step.goodput is None:
        return True
    g = step.goodput
    return g.percentiles_met and (not g.per_request or g.fraction >= attainment)


def client_bound(step: Step) -> bool:
    """The replayer sent late (schedule lag p99 over the verdict's threshold): what the step shows
    is the client's limit as much as the engine's, so it is evidence about neither."""
    return step.lag_p99_ms > LAG_WARN_MS


def fails_beyond_noise(step: Step, max_error_rate: float, attainment: float) -> bool:
    """The step fails `meets` and its interval says so too (report.noise, as the gate and the
    verdict judge): errors or a percentile SLO over the limit, or the interval of the share meeting
    the per-request SLOs wholly below `attainment`. One run whose interval reaches the limit is not
    enough to rule a configuration out."""
    if meets(step, max_error_rate, attainment):
        return False
    g = step.goodput
    if step.error_rate >= max_error_rate or g is None or not g.percentiles_met or not g.per_request:
        return True
    draws = noise.share_draws(
        [noise.RunCount(g.good, g.total, step.duration_s)], 1000, np.random.default_rng(0)
    )
    share = noise.interval(g.fraction, draws)
    return noise.judge(share, lambda x: x >= attainment) == "fail"


def auto_search(
    run_step: Callable[[float], Step],
    passes: Callable[[Step], bool],
    *,
    start: float = START_SPEED,
    max_runs: int = MAX_RUNS,
    precision: float = 0.05,
    min_speed: float = 1 / 64,
    max_speed: float = 4096.0,
) -> tuple[list[Step], float | None]:
    """Doubling (or halving) to bracket the limit, then bisection to `precision`; returns the steps
    run and the best load.

    Reusable for any positive load (a speed, a rate in req/s, a concurrency): `run_step(load)` runs
    one step, `passes(step)` judges it. The best load is the highest one that passed; None when even
    the lowest tried failed.
    """
    steps: list[Step] = []
    results: dict[float, bool] = {}

    def attempt(speed: float) -> bool:
        step = run_step(speed)
        steps.append(step)
        results[speed] = passes(step)
        return results[speed]

    speed = start
    ok = attempt(speed)
    while len(steps) < max_runs:
        nxt = speed * 2 if ok else speed / 2
        if not min_speed <= nxt <= max_speed or results.get(nxt) is not None:
            break
        if attempt(nxt) != ok:
            break
        speed = nxt
    while len(steps) < max_runs:
        passed = [s for s, r in results.items() if r]
        failed = [s for s, r in results.items() if not r]
        if not passed or not failed:
            break
        low = max(passed)
        high = min(s for s in failed if s > low) if any(s > low for s in failed) else None
        if high is None or (high - low) / low <= precision:
            break
        mid = float(f"{(low + high) / 2:.3g}")
        if mid in results:
            break
        attempt(mid)
    passed = [s for s, r in results.items() if r]
    return steps, (max(passed) if passed else None)
