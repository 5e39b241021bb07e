"""Sweeps: one trace replayed at rising speeds; the per-step table, the knee, and the --auto search.

Knee rule (docs/report.md): steps are taken in speed order and each is compared with the one
before. A step *breaks* when its throughput stops growing (achieved req/s grew by less than half
of the offered increase), its p95 TTFT jumps (more than doubles and rises by over 50 ms), or
failures appear (error rate at or above the threshold). The knee is the step before the first
break: the highest load the target served without sign of saturation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from replayproxy.report.goodput import Goodput, Slo, goodput
from replayproxy.report.measures import concurrency
from replayproxy.report.runs import Run
from replayproxy.report.stats import Summary, summarize

GROWTH_SHARE = 0.5  # of the offered increase that must show up as achieved throughput
P95_JUMP_FACTOR = 2.0
P95_JUMP_MIN_MS = 50.0
MAX_ERROR_RATE = 0.01


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

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


def step_of(run: Run, slos: tuple[Slo, ...] = ()) -> Step:
    m = run.measures
    duration = m.duration_s if m.duration_s > 0 else math.nan
    ok_tokens = float(m.output_tokens[m.ok & (m.output_tokens >= 0)].sum())
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
        goodput=goodput(m, slos) if slos else None,
    )


@dataclass(frozen=True, slots=True)
class Knee:
    step: int | None  # index into the speed-sorted steps; None: the lowest speed already broke
    broke_at: int | None  # the first step that broke; None: no step broke
    reasons: tuple[str, ...]  # why broke_at broke

    def describe(self, steps: list[Step]) -> str:
        if self.broke_at is None:
            return (
                f"no knee up to {steps[-1].speed:g}x (no step broke); try higher speeds"
                if steps
                else "no steps"
            )
        why = ", ".join(self.reasons)
        if self.step is None:
            return f"already past the knee at the lowest speed {steps[0].speed:g}x ({why})"
        return f"knee at {steps[self.step].speed:g}x: the next step ({steps[self.broke_at].speed:g}x) {why}"


def break_reasons(prev: Step | None, cur: Step, max_error_rate: float = MAX_ERROR_RATE) -> list[str]:
    reasons = []
    if cur.error_rate >= max_error_rate:
        reasons.append(f"failed {cur.error_rate:.1%} of requests")
    if prev is None:
        return reasons
    offered = cur.speed / prev.speed
    if cur.requests_per_s < prev.requests_per_s * (1 + GROWTH_SHARE * (offered - 1)):
        reasons.append(
            f"throughput stopped growing ({prev.requests_per_s:.3g} -> {cur.requests_per_s:.3g} req/s "
            f"for {offered:.3g}x the load)"
        )
    before, after = prev.ttft_ms.p95, cur.ttft_ms.p95
    if after > P95_JUMP_FACTOR * before and after - before > P95_JUMP_MIN_MS:
        reasons.append(f"p95 TTFT jumped ({before:.4g} -> {after:.4g} ms)")
    return reasons


def find_knee(steps: list[Step], max_error_rate: float = MAX_ERROR_RATE) -> Knee:
    """Apply the knee rule to steps sorted by speed."""
    prev: Step | None = None
    for i, cur in enumerate(steps):
        reasons = break_reasons(prev, cur, max_error_rate)
        if reasons:
            return Knee(i - 1 if i > 0 else None, i, tuple(reasons))
        prev = cur
    return Knee(len(steps) - 1 if steps else None, None, ())


def check_share(option: str, value: float) -> None:
    """Reject a rate or share option outside (0, 1] (NaN included) before any work is done."""
    if not 0 < value <= 1:
        raise ValueError(f"{option} must be in (0, 1], got {value:g}")


def meets(step: Step, max_error_rate: float, attainment: float) -> bool:
    """--auto's pass rule: few errors, percentile SLOs met, and enough requests meeting per-request SLOs."""
    if step.error_rate >= max_error_rate:
        return False
    if step.goodput is None:
        return True
    g = step.goodput
    return g.percentiles_met and (not g.per_request or g.fraction >= attainment)


def auto_search(
    run_step: Callable[[float], Step],
    passes: Callable[[Step], bool],
    *,
    start: float = 1.0,
    max_runs: int = 8,
    precision: float = 0.05,
    min_speed: float = 1 / 64,
    max_speed: float = 4096.0,
) -> tuple[list[Step], float | None]:
    """Doubling (or halving) to bracket the limit, then bisection; returns steps run and best speed.

    The best speed is the highest one that passed; None when even the lowest tried failed.
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
