"""The operating-point rule and the --auto search, on constructed steps."""

from __future__ import annotations

import numpy as np
import pytest

from replayproxy.report.goodput import Goodput, PercentileCheck, Slo
from replayproxy.report.stats import Summary
from replayproxy.report.sweep import Step, auto_search, find_knee, meets


def step(
    speed: float,
    rps: float,
    ttft_p95: float = 50.0,
    errors: int = 0,
    requests: int = 1000,
    good: Goodput | None = None,
    offered: float = float("nan"),
) -> Step:
    ttft = Summary(requests, 10.0, 20.0, ttft_p95, ttft_p95, ttft_p95, 15.0)
    duration = requests / rps if rps else float("nan")  # E2E unknown: no latency to discount
    empty = Summary(0)
    return Step(
        speed, f"{speed}x", requests, rps, rps * 100, 1.0, ttft, empty, empty, errors, good, offered,
        duration_s=duration,
    )  # fmt: skip


def test_knee_where_throughput_stops_growing() -> None:
    steps = [step(1, 10), step(2, 20), step(4, 39), step(8, 45), step(16, 46)]
    knee = find_knee(steps)
    assert (knee.step, knee.broke_at) == (2, 3)  # 4x -> 8x offered doubled but achieved grew 15%
    assert "throughput stopped growing" in knee.reasons[0]
    assert knee.describe(steps).startswith("operating point at 4x: the next step (8x)")


def test_knee_where_p95_jumps_or_failures_appear() -> None:
    jump = [step(1, 10, 40), step(2, 20, 70), step(4, 40, 900)]
    assert find_knee(jump).step == 1 and "p95 TTFT bent" in find_knee(jump).reasons[0]
    # p95 grew 1.75x for 2x the load: it did not bend; then 12.9x for 2x the load: it did.
    assert "(70 -> 900 ms for 2x the load)" in find_knee(jump).reasons[0]
    small = [step(1, 10, 4), step(2, 20, 12)]  # tripled but by only 8 ms: noise, not a bend
    assert find_knee(small).broke_at is None
    failing = [step(1, 10), step(2, 20, errors=30)]
    assert find_knee(failing).step == 0 and "failed 3.0%" in find_knee(failing).reasons[0]
    assert find_knee(failing, max_error_rate=0.05).broke_at is None


def test_no_knee_and_knee_below_lowest_speed() -> None:
    steady = [step(1, 10), step(2, 20)]
    assert find_knee(steady).step == 1 and find_knee(steady).broke_at is None
    assert "no step bent; try higher loads" in find_knee(steady).describe(steady)
    broken = [step(1, 10, errors=500), step(2, 20, errors=900)]
    knee = find_knee(broken)
    assert knee.step is None and "already saturated at the lowest step" in knee.describe(broken)


def test_saturated_at_the_lowest_step_asks_for_lower_steps() -> None:
    # The trace already saturated the engine at the lowest step: offered 19.8 req/s, achieved 9.6.
    steps = [step(1, 9.6, offered=19.8), step(2, 9.7, offered=39.6)]
    knee = find_knee(steps)
    assert knee.step is None and knee.broke_at == 0
    text = knee.describe(steps)
    assert "already saturated at the lowest step, 1x (19.8 req/s offered)" in text
    assert "achieved 9.6 of 19.8 req/s offered" in text and "add lower steps" in text


def test_a_short_run_is_not_saturated_by_its_own_tail() -> None:
    # 30 requests offered at 20 req/s over 1.45 s; the last ends 0.5 s later (E2E p50 0.4 s):
    # 30 / 1.95 s looks like 15 req/s achieved, but over the arrival time it served 19.4 req/s.
    e2e = Summary(30, 400.0, 500.0, 500.0, 500.0, 500.0, 400.0)
    lowest = Step(1, "1x", 30, 30 / 1.95, 100.0, 4.0, e2e, Summary(0), e2e, 0, None, 20.7, duration_s=1.95)
    assert find_knee([lowest]).broke_at is None


def test_a_step_whose_p95_crosses_the_slo_bends() -> None:
    crossed = step(2, 20)
    crossed = Step(**{**{f: getattr(crossed, f) for f in Step.__dataclass_fields__},
                      "slo_crossed": ("ttft p95 900 ms > SLO 500 ms",)})  # fmt: skip
    knee = find_knee([step(1, 10), crossed])
    assert knee.step == 0 and "crossed the SLO (ttft p95 900 ms > SLO 500 ms)" in knee.reasons


def test_meets_uses_errors_percentiles_and_attainment() -> None:
    slos = (Slo("ttft", 100.0), Slo("ttft", 200.0, 95.0))
    good = Goodput(950, 1000, 9.5, (PercentileCheck(slos[1], 150.0, 1000),), slos)
    assert meets(step(1, 10, good=good), 0.01, 0.9)
    assert not meets(step(1, 10, good=good), 0.01, 0.99)  # only 95% met the per-request SLO
    assert not meets(step(1, 10, errors=10, good=good), 0.01, 0.9)
    missed = Goodput(1000, 1000, 10, (PercentileCheck(slos[1], 250.0, 1000),), slos)
    assert not meets(step(1, 10, good=missed), 0.01, 0.9)


def _capacity(limit: float):  # type: ignore[no-untyped-def]
    tried: list[float] = []

    def run(speed: float) -> Step:
        tried.append(speed)
        return step(speed, min(speed, limit) * 10, errors=0 if speed <= limit else 100)

    return run, tried, lambda s: s.errors == 0


@pytest.mark.parametrize("limit", [0.3, 3.3, 10.0])
def test_auto_search_finds_the_limit_within_precision(limit: float) -> None:
    run, tried, passes = _capacity(limit)
    steps, best = auto_search(run, passes, start=1.0, max_runs=12, precision=0.05)
    assert best is not None and best <= limit
    assert best >= limit * 0.9
    assert len(steps) == len(tried) <= 12 and len(set(tried)) == len(tried)


def test_auto_search_respects_the_run_budget_and_reports_no_pass() -> None:
    run, tried, passes = _capacity(100.0)
    steps, best = auto_search(run, passes, start=1.0, max_runs=3)
    assert tried == [1.0, 2.0, 4.0] and best == 4.0
    run, tried, passes = _capacity(0.001)
    steps, best = auto_search(run, passes, start=1.0, max_runs=4)
    assert best is None and tried == [1.0, 0.5, 0.25, 0.125]


def _with(s: Step, **changes: object) -> Step:
    return Step(**{**{f: getattr(s, f) for f in Step.__dataclass_fields__}, **changes})  # type: ignore[arg-type]


def test_the_shortfall_is_said_with_the_tables_achieved_figure() -> None:
    # 300 requests over 31.2 s: the table says 9.63 req/s achieved; the rule discounts the run's own
    # tail (E2E p50 9.8 s), which made an earlier wording say "served 14": a figure of no table.
    e2e = Summary(300, 9800.0, 12000.0, 12000.0, 12000.0, 12000.0, 9800.0)
    lowest = Step(
        1, "1x", 300, 300 / 31.15, 500.0, 40.0, e2e, Summary(0), e2e, 0, None, 19.9, duration_s=31.15
    )
    assert f"{lowest.requests_per_s:.3g}" == "9.63" and lowest.served_requests_per_s == pytest.approx(
        14, abs=0.1
    )
    knee = find_knee([lowest, _with(lowest, speed=2, offered_requests_per_s=39.8)])
    assert knee.reasons == ("achieved 9.63 of 19.9 req/s offered",)
    assert "served" not in knee.describe([lowest])


def test_a_failure_no_higher_step_repeats_is_noise_not_saturation() -> None:
    steps = [step(1, 10, errors=500), step(2, 20), step(4, 40)]
    knee = find_knee(steps)
    assert knee.broke_at is None and knee.step == 2
    assert knee.noise == (
        "1x failed 50.0% of requests, but a higher load, 2x, did not: read as noise (non-monotone), "
        "not saturation",
    )
    assert "already saturated" not in knee.describe(steps)


def test_a_throughput_dip_that_a_higher_step_recovers_is_noise() -> None:
    # 2x achieved barely more than 1x (a dip), but 4x achieved 40: throughput had not stopped growing.
    steps = [step(1, 10), step(2, 11), step(4, 40), step(8, 45)]
    knee = find_knee(steps)
    assert (knee.step, knee.broke_at) == (2, 3)
    assert knee.noise[0].startswith(
        "2x throughput stopped growing (10 -> 11 req/s for 2x the load), but a higher"
    )
    assert knee.describe(steps).startswith("operating point at 4x: the next step (8x) throughput stopped")
    # A dip no higher step recovers from is the knee, as before.
    flat = [step(1, 10), step(2, 11), step(4, 11.5)]
    assert find_knee(flat).step == 0 and find_knee(flat).noise == ()


def test_a_latency_jump_that_falls_back_is_noise() -> None:
    steps = [step(1, 10, 40), step(2, 20, 900), step(4, 40, 60)]
    knee = find_knee(steps)
    assert knee.broke_at is None and "2x p95 TTFT bent" in knee.noise[0]


def test_saturated_at_the_lowest_step_never_beside_a_step_meeting_the_slo() -> None:
    # The sweep: 1x achieved 9.63 of 19.9 req/s offered, yet 2x achieved 11.5 and met the
    # SLO. The lowest step's shortfall is noise: the engine served a higher load within the SLO.
    low = step(1, 9.63, offered=19.9)
    high = step(2, 11.5, offered=39.8)
    met = lambda s: s is high  # noqa: E731
    knee = find_knee([low, high], passes=met)
    assert knee.step is not None and "already saturated" not in knee.describe([low, high])
    assert "1x (19.9 req/s offered) achieved 9.63 of 19.9 req/s offered, but a higher load" in knee.noise[0]
    # Without an SLO met anywhere, the shortfall stands (the existing rule).
    assert find_knee([low, high], passes=lambda s: False).step is None
    # A lowest step that itself met the SLO is not called saturated either.
    knee = find_knee([low, _with(high, requests_per_s=9.7)], passes=lambda s: s is low)
    assert knee.step is not None and knee.noise[0].endswith("but met the SLO: not read as saturation")


def test_randomized_sweeps_never_say_saturated_beside_a_step_meeting_the_slo() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(2, 6))
        loads = np.sort(rng.uniform(1, 40, n))
        steps = [
            step(float(load), float(rng.uniform(0.3, 1.1) * load), float(rng.uniform(20, 900)),
                 errors=int(rng.choice([0, 0, 30])), offered=float(load))
            for load in loads
        ]  # fmt: skip
        passing = {id(s) for s in steps if rng.random() < 0.3}
        knee = find_knee(steps, passes=lambda s, ok=passing: id(s) in ok)  # type: ignore[misc]
        if knee.step is None and knee.broke_at is not None:
            assert not passing


def test_a_client_bound_steps_throughput_is_not_read_as_the_engines() -> None:
    lowest = _with(step(1, 9.6, offered=19.8), lag_p99_ms=40.0)
    knee = find_knee([lowest, step(2, 9.7, offered=39.6)])
    assert knee.step is not None and knee.noise[0].startswith(
        "1x (19.8 req/s offered): client-bound (schedule"
    )
