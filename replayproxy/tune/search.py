"""One configuration's highest rate under the SLO: the sweep's rate search, an early stop, repeats.

The search is the sweep's own (`report.sweep.auto_search`: bracket by doubling or halving, then
bisect to a precision). Two additions make it fit for tuning. An early stop: once another
configuration of the engine has passed at speed B, this one is tried at B first, and if it fails
there beyond the noise it cannot beat the best so far, so no more of its runs are spent (a run that
the client limited, or whose interval reaches the limit, stops nothing). Repeats: the best passing
speed is replayed `repeat` times in all, and only a speed that passes every time is the answer,
so the result carries the run-to-run noise instead of one lucky run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from replayproxy.report.sweep import Step, auto_search, client_bound


@dataclass(frozen=True, slots=True)
class Probe:
    """One replay of the search: the figures the tune table shows."""

    speed: float
    repetition: int
    passed: bool
    requests_per_s: float
    ttft_p95_ms: float
    tpot_p95_ms: float
    error_rate: float
    goodput_per_s: float | None
    path: str
    client_bound: bool = False  # schedule lag p99 high: the replayer limited the run, not the engine

    def to_json(self) -> dict[str, Any]:
        return {name: _json(getattr(self, name)) for name in self.__slots__}


@dataclass(slots=True)
class Search:
    """Everything one configuration's search found."""

    probes: list[Probe] = field(default_factory=list)
    best_speed: float | None = None  # the highest speed that passed every repeat
    failed_speed: float | None = None  # the lowest speed above it that failed: the answer's bracket
    stopped: str = ""  # why the search ended early, if it did
    client_bound: list[float] = field(default_factory=list)  # speeds whose failure the client caused

    def probes_at(self, speed: float) -> list[Probe]:
        return [p for p in self.probes if p.speed == speed]


RunStep = Callable[[float, int], tuple[Step, str]]  # (speed, repetition) -> (figures, result path)


def search(
    run_step: RunStep,
    passes: Callable[[Step], bool],
    *,
    start: float,
    beat: float | None,
    repeat: int,
    max_runs: int,
    precision: float,
    fails_beyond_noise: Callable[[Step], bool] = lambda step: True,
) -> Search:
    """Search one configuration; `beat` is the best speed of the engine so far (None: none yet).

    A failing step whose replay was client-bound (`report.sweep.client_bound`) is marked and the
    search goes on below it, as after a failure, but it is never the engine's failure: it neither
    brackets the answer nor stops the search. The early stop needs a failure beyond the noise
    (`fails_beyond_noise`), not one run whose interval reaches the limit."""
    found = Search()
    verdicts: dict[float, bool] = {}  # speed -> passed its first run (later: every run)
    first_steps: dict[float, Step] = {}

    def run_once(speed: float) -> Step:
        if speed not in first_steps:
            step, path = run_step(speed, 1)
            first_steps[speed], verdicts[speed] = step, passes(step)
            bound = not verdicts[speed] and client_bound(step)
            if bound:
                found.client_bound.append(speed)
            found.probes.append(_probe(step, speed, 1, verdicts[speed], path, bound))
        return first_steps[speed]

    if beat is not None:
        step = run_once(beat)
        if not verdicts[beat] and beat not in found.client_bound and fails_beyond_noise(step):
            found.failed_speed = beat
            found.stopped = f"cannot beat the best so far: fails at {beat:g}x beyond the noise"
            return found
    origin = beat if beat is not None else start
    auto_search(run_once, passes, start=origin, max_runs=max_runs, precision=precision)
    _confirm(found, verdicts, run_step, passes, repeat)
    if beat is not None and found.best_speed is None and beat not in found.client_bound:
        found.stopped = f"cannot beat the best so far: failed a repeat at {beat:g}x"
    if found.client_bound:
        speeds = ", ".join(f"{s:g}x" for s in sorted(found.client_bound))
        found.stopped = "; ".join(
            x
            for x in (found.stopped, f"client-bound at {speeds} (replay lag, not counted against the engine)")
            if x
        )
    return found


def _confirm(
    found: Search,
    verdicts: dict[float, bool],
    run_step: RunStep,
    passes: Callable[[Step], bool],
    repeat: int,
) -> None:
    """Repeat the best passing speed; a speed that fails any repeat gives way to the next one down."""
    while True:
        passed = sorted((s for s, ok in verdicts.items() if ok), reverse=True)
        if not passed:
            break
        best = passed[0]
        for repetition in range(len(found.probes_at(best)) + 1, repeat + 1):
            step, path = run_step(best, repetition)
            ok = passes(step)
            bound = not ok and client_bound(step)
            found.probes.append(_probe(step, best, repetition, ok, path, bound))
            if bound and best not in found.client_bound:
                found.client_bound.append(best)
            if not ok:
                verdicts[best] = False
                break
        if verdicts[best]:
            found.best_speed = best
            break
    above = [
        s
        for s, ok in verdicts.items()
        if not ok and s not in found.client_bound and (found.best_speed is None or s > found.best_speed)
    ]
    found.failed_speed = min(above) if above else None


def _probe(step: Step, speed: float, repetition: int, passed: bool, path: str, bound: bool) -> Probe:
    return Probe(
        speed=speed,
        repetition=repetition,
        passed=passed,
        requests_per_s=step.requests_per_s,
        ttft_p95_ms=step.ttft_ms.p95,
        tpot_p95_ms=step.tpot_ms.p95,
        error_rate=step.error_rate,
        goodput_per_s=step.goodput.requests_per_s if step.goodput is not None else None,
        path=path,
        client_bound=bound,
    )


def _json(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value
