"""`report --gate`: exit 1 with one line when a candidate falls behind the named base run."""

from __future__ import annotations

from pathlib import Path

import pytest

from replayproxy.cli import main
from replayproxy.report.regression_gate import parse_gate
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
    assert " req/s against a limit of " in err[0] and "(0.95 x v0.9's " in err[0]


def test_an_equal_or_better_candidate_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _run(tmp_path / "old.rpr", "v0.9", 0.6)
    new = _run(tmp_path / "new.rpr", "v1.0", 0.95, seed=1)
    assert main(["report", old, new, "--slo", "ttft<=100ms", "--gate", GATE, "--gate-base", "v0.9"]) == 0
    assert capsys.readouterr().err == ""


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
        parse_gate(spec)


def test_an_unknown_base_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = _run(tmp_path / "old.rpr", "v0.9", 0.6)
    assert main(["report", old, "--slo", "ttft<=100ms", "--gate", GATE, "--gate-base", "v0.8"]) == 2
    assert "--gate-base 'v0.8' is not a candidate; candidates: v0.9" in capsys.readouterr().err
