"""The per-configuration search: the sweep's bracket-and-bisect, the early stop, and repeats."""

from __future__ import annotations

from collections.abc import Callable

from replayproxy.report.stats import Summary
from replayproxy.report.sweep import Step
from replayproxy.tune.search import search


def _step(speed: float, ttft_p95_ms: float, lag_p99_ms: float = 0.1) -> Step:
    ttft = Summary(count=10, p95=ttft_p95_ms)
    return Step(
        speed, "x", 10, speed * 10, 0.0, 1.0, ttft, Summary(0), Summary(0), 0, None, lag_p99_ms=lag_p99_ms
    )


def _engine(
    limit: float, flaky_at: dict[float, list[bool]] | None = None, client_limit: float = 1e9
) -> tuple[Callable, list[float]]:
    """A fake engine that meets the SLO up to `limit`x; `flaky_at[speed]` overrides run by run; above
    `client_limit`x the replayer falls behind (lag p99 50 ms) and the step fails for that reason."""
    calls: list[float] = []

    def run_step(speed: float, repetition: int) -> tuple[Step, str]:
        calls.append(speed)
        ok = speed <= limit and speed <= client_limit
        if flaky_at and speed in flaky_at:
            ok = flaky_at[speed][repetition - 1]
        lag = 50.0 if speed > client_limit else 0.1
        return _step(speed, 100.0 if ok else 900.0, lag), f"speed-{speed:g}-r{repetition}.rpr"

    return run_step, calls


def _passes(step: Step) -> bool:
    return step.ttft_ms.p95 <= 500.0


def test_the_search_brackets_then_bisects_and_repeats_the_answer() -> None:
    run_step, calls = _engine(limit=3.0)
    found = search(run_step, _passes, start=1.0, beat=None, repeat=3, max_runs=10, precision=0.1)
    assert calls[:3] == [1.0, 2.0, 4.0]  # doubling until the first failure
    assert found.best_speed is not None and 2.7 <= found.best_speed <= 3.0
    assert found.failed_speed is not None and found.failed_speed > 3.0
    assert (found.failed_speed - found.best_speed) / found.best_speed <= 0.1 + 1e-9
    assert [p.repetition for p in found.probes_at(found.best_speed)] == [1, 2, 3]
    assert not found.stopped


def test_a_configuration_that_fails_at_the_best_so_far_costs_one_run() -> None:
    run_step, calls = _engine(limit=1.5)
    found = search(run_step, _passes, start=1.0, beat=2.0, repeat=3, max_runs=10, precision=0.1)
    assert calls == [2.0]
    assert found.best_speed is None and found.failed_speed == 2.0
    assert "cannot beat the best so far" in found.stopped


def test_a_speed_that_fails_a_repeat_gives_way_to_the_next_one_down() -> None:
    # 4x passes once, then fails its second run: the answer is 2x, confirmed three times.
    run_step, _ = _engine(limit=4.0, flaky_at={4.0: [True, False, True]})
    found = search(run_step, _passes, start=1.0, beat=None, repeat=3, max_runs=3, precision=0.1)
    assert found.best_speed == 2.0
    assert found.failed_speed == 4.0
    assert [p.passed for p in found.probes_at(4.0)] == [True, False]
    assert [p.repetition for p in found.probes_at(2.0)] == [1, 2, 3]


def test_failing_at_the_lowest_speed_tried_leaves_no_answer() -> None:
    run_step, _ = _engine(limit=0.01)
    found = search(run_step, _passes, start=1.0, beat=None, repeat=2, max_runs=3, precision=0.1)
    assert found.best_speed is None
    assert found.failed_speed == 0.25
    assert all(not p.passed for p in found.probes)


def test_a_client_bound_failure_is_marked_and_never_the_engines() -> None:
    """The engine holds 8x, but the replayer falls behind above 3x: those steps are marked, the search
    goes on below them, and neither the bracket nor the early stop rests on them."""
    run_step, calls = _engine(limit=8.0, client_limit=3.0)
    found = search(run_step, _passes, start=1.0, beat=4.0, repeat=2, max_runs=10, precision=0.1)
    assert calls[0] == 4.0 and len(calls) > 1  # 4x was client-bound: not pruned on it
    assert 4.0 in found.client_bound and all(p.client_bound for p in found.probes if p.speed > 3.0)
    assert not any(p.client_bound for p in found.probes if p.speed <= 3.0)
    assert found.best_speed is not None and found.best_speed <= 3.0
    assert found.failed_speed is None  # no failure of the engine's own was seen
    assert "cannot beat" not in found.stopped and found.stopped.startswith("client-bound at 3.25x, 3.5x, 4x")


def test_no_configuration_is_pruned_on_one_run_within_the_noise() -> None:
    run_step, calls = _engine(limit=1.5)
    found = search(
        run_step, _passes, start=1.0, beat=2.0, repeat=3, max_runs=10, precision=0.1,
        fails_beyond_noise=lambda step: False,
    )  # fmt: skip
    assert calls[0] == 2.0 and len(calls) > 1  # failed at 2x once, within the noise: searched on
    assert "cannot beat the best so far: fails at" not in found.stopped
    assert found.best_speed is not None and found.best_speed <= 1.5
