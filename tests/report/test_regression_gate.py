"""`report --gate`: judged on the verdict's intervals; exit 1 with one line when a candidate's whole
interval falls behind the named base run, 3 when the interval straddles the limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from replayproxy.cli import main
from replayproxy.report.regression_gate import parse_replay_gate
from tests.report.test_verdict import _run

GATE = "goodput>=0.95*BASE,ttft:p95<=1.10*BASE"


def test_a_regression_fails_the_gate_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = _run(tmp_path / "old.rpr", "v0.9", 0.9)
    new = _run(tmp_path / "new.rpr", "v1.0", 0.5, seed=1)
    code = main(["report", old, new, "--slo", "ttft<=100ms", "--gate", GATE, "--gate-base", "v0.9"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert err[0].startswith("replayproxy report: gate failed: v1.0 goodput>=0.95*BASE: ")
    assert (
        "x v0.9's " in err[0] and "95% CI [" in err[0] and "] is below 0.95 (1 run each: run-to-run" in err[0]
    )


def _runs(tmp_path: Path, label: str, shares: tuple[float, ...], seed: int) -> list[str]:
    return [_run(tmp_path / f"{label}{i}.rpr", label, s, seed=seed + i) for i, s in enumerate(shares)]


def test_noisy_repetitions_of_one_engine_are_inconclusive_not_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The means differ by more than 5 %, but the runs of each differ by far more: an A/A pair."""
    paths = _runs(tmp_path, "A", (0.9, 0.5, 0.7), 0) + _runs(tmp_path, "B", (0.4, 0.8, 0.6), 10)
    code = main(
        ["report", *paths, "--slo", "ttft<=100ms", "--gate", "goodput>=0.95*BASE", "--gate-base", "A"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and len(err) == 1
    assert err[0].startswith(
        "replayproxy report: gate inconclusive, run more repetitions: B goodput>=0.95*BASE: "
    )
    low, high = (float(x) for x in err[0].split("95% CI [")[1].split("]")[0].split(", "))
    assert low < 0.95 < high and "3 runs each" in err[0]


def test_a_regression_beyond_the_noise_fails_with_its_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _runs(tmp_path, "on", (0.9, 0.85, 0.95), 0) + _runs(tmp_path, "off", (0.4, 0.45, 0.35), 10)
    code = main(["report", *paths, "--slo", "ttft<=100ms", "--gate", GATE, "--gate-base", "on"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert err[0].startswith("replayproxy report: gate failed: off goodput>=0.95*BASE: 0.")
    high = float(err[0].split("95% CI [")[1].split("]")[0].split(", ")[1])
    assert high < 0.95


def test_a_latency_rule_is_judged_on_its_interval_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _runs(tmp_path, "A", (0.5, 0.5, 0.5), 0) + _runs(tmp_path, "B", (0.5, 0.5, 0.5), 10)
    code = main(["report", *paths, "--gate", "ttft:p50<=1.1*BASE,error_rate<=1*BASE", "--gate-base", "A"])
    err = capsys.readouterr().err
    # the p50 sits between the two TTFT levels (20 ms and 400 ms): the ratio's interval is wide
    assert code in (0, 3) and "gate failed" not in err
    assert main(["report", *paths, "--gate", "ttft:max<=1.1*BASE", "--gate-base", "A"]) == 0


def test_an_equal_or_better_candidate_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _run(tmp_path / "old.rpr", "v0.9", 0.6)
    new = _run(tmp_path / "new.rpr", "v1.0", 0.95, seed=1)
    assert main(["report", old, new, "--slo", "ttft<=100ms", "--gate", GATE, "--gate-base", "v0.9"]) == 0
    assert capsys.readouterr().err == ""
    # a figure that is 0 at BASE (no errors) keeps a limit of 0 whatever the factor
    assert main(["report", old, new, "--gate", "error_rate<=1.5*BASE", "--gate-base", "v0.9"]) == 0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ttft<=1.1*BASE", "needs a statistic"),
        ("speed>=1*BASE", "unknown metric 'speed'"),
        ("goodput>=0.95", "compared with BASE"),
        ("ttft:p95<<1.1*BASE", "cannot read"),
        ("goodput:p95>=1*BASE", "takes no statistic"),
    ],
)
def test_bad_gates_are_one_line_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_replay_gate(spec)


def test_an_unknown_base_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _run(tmp_path / "old.rpr", "v0.9", 0.6)
    assert main(["report", old, "--slo", "ttft<=100ms", "--gate", GATE, "--gate-base", "v0.8"]) == 2
    assert "--gate-base 'v0.8' is not a candidate; candidates: v0.9" in capsys.readouterr().err
