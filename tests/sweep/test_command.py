"""`replayproxy sweep` with the replay step replaced by a fake queueing engine (the real one is in e2e)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from replayproxy.cli import main
from replayproxy.errors import RunAborted
from replayproxy.sweep import command as sweep_command
from tests.report.helpers import result, write_run
from tests.report.test_baseline import write_baseline_trace

REQUESTS, INTERVAL_MS = 100, 100.0  # the trace: 10 req/s at 1x


def fake_replay(capacity_per_s: float, calls: list[list[str]]):  # type: ignore[no-untyped-def]
    """One server with a FIFO queue: service time 1/capacity; TTFT is queueing + service."""

    def run(command: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        calls.append(list(command))
        speed = float(command[command.index("--speed") + 1])
        out = Path(command[command.index("-o") + 1])
        service_ms = 1000.0 / capacity_per_s
        free_at, results = 0.0, []
        for i in range(REQUESTS):
            sent = i * INTERVAL_MS / speed
            free_at = max(free_at, sent) + service_ms
            latency = free_at - sent
            results.append(result(i, sent_ms=sent, ttft_ms=latency, e2e_ms=latency, completion_tokens=1))
        write_run(out, results, target="http://engine", options={"speed": speed})

    return run


def test_sweep_runs_each_speed_and_names_the_knee(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(sweep_command, "run_replay", fake_replay(25.0, calls))
    argv = [
        "sweep",
        str(write_baseline_trace(tmp_path / "t.rpt")),
        "--target",
        "http://engine",
        "--speeds",
        "4,1,2,8",
        "-o",
        str(tmp_path / "sw"),
        "--slo",
        "ttft<=200ms",
        "--replay-args",
        "--model",
        "m",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert [c[c.index("--speed") + 1] for c in calls] == ["1", "2", "4", "8"]
    assert calls[0][:4] == [sys.executable, "-m", "replayproxy", "replay"]
    assert calls[0][-4:] == ["--progress", "log", "--model", "m"]
    assert sorted(p.name for p in (tmp_path / "sw").iterdir()) == [f"speed-{s}.rpr" for s in (1, 2, 4, 8)]
    assert "operating point at 2x (20.2 req/s offered): the next step (4x (40.4 req/s offered))" in out
    assert "throughput stopped growing" in out or "crossed the SLO" in out
    assert out.splitlines()[2].split()[:5] == ["load", "offered", "req/s", "achieved", "req/s"]
    # `report DIR/*.rpr` recognises the same sweep from the speeds in the result headers
    assert main(["report", str(tmp_path / "sw"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (sweep,) = doc["sweeps"]
    assert [s["speed"] for s in sweep["steps"]] == [1, 2, 4, 8] and sweep["knee_speed"] == 2
    assert doc["comparisons"] == []  # different speeds are loads, not candidates


def test_auto_finds_the_highest_speed_meeting_the_slo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(sweep_command, "run_replay", fake_replay(25.0, calls))
    argv = [
        "sweep",
        str(write_baseline_trace(tmp_path / "t.rpt")),
        "--target",
        "http://engine",
        "--auto",
        "--slo",
        "ttft:p95<=100ms",
        "--max-runs",
        "7",
        "-o",
        str(tmp_path / "sw"),
        "--json",
    ]
    assert main(argv) == 0
    sweep = json.loads(capsys.readouterr().out)["sweeps"][0]
    best = sweep["best_speed_meeting_slo"]
    assert 1 <= len(calls) <= 7
    assert best is not None and 2.0 <= best <= 2.5  # saturates at 2.5x (25 req/s of a 10 req/s trace)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--auto"], "--auto needs --slo"),
        (["--speeds", "1,x"], "--speeds must be numbers"),
        (["--speeds", "0,1"], "--speeds must be positive"),
        (["--auto", "--slo", "ttft<=1ms", "--max-runs", "0"], "--max-runs must be at least 1"),
        (["--auto", "--slo", "ttft<=1ms", "--start-speed", "0"], "--start-speed must be a positive number"),
        (["--auto", "--slo", "ttft<=1ms", "--attainment", "5"], "--attainment must be in (0, 1]"),
        (["--speeds", "1", "--max-error-rate", "nan"], "--max-error-rate must be in (0, 1]"),
        (["--speeds", "1"], "no such file: t.rpt"),
    ],
)
def test_bad_options_are_one_line(
    tmp_path: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sweep", "t.rpt", "--target", "http://x", "-o", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_damaged_trace_fails_before_any_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(sweep_command, "run_replay", fake_replay(25.0, calls))
    trace = tmp_path / "t.rpt"
    trace.write_bytes(b"not a trace at all")
    assert main(["sweep", str(trace), "--target", "http://x", "--speeds", "1", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"replayproxy sweep: error: {trace}: not a replayproxy file (bad magic)"]
    assert calls == []


def test_failed_replay_step_stops_with_its_last_line(tmp_path: Path) -> None:
    with pytest.raises(RunAborted, match="replay step failed: boom"):
        sweep_command.run_replay([sys.executable, "-c", "import sys; sys.exit('boom')"])


def test_rates_become_speeds_through_the_traces_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(sweep_command, "run_replay", fake_replay(25.0, calls))
    trace = write_baseline_trace(tmp_path / "t.rpt")  # 3 requests over 2 s: 1.5 req/s at 1x
    argv = ["sweep", str(trace), "--target", "http://engine", "--rates", "3,6", "-o", str(tmp_path / "sw")]
    assert main(argv) == 0
    assert [c[c.index("--speed") + 1] for c in calls] == ["2", "4"]
    assert sorted(p.name for p in (tmp_path / "sw").iterdir()) == ["rate-3.rpr", "rate-6.rpr"]


def test_concurrency_steps_are_a_closed_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(sweep_command, "run_replay", fake_replay(25.0, calls))
    trace = write_baseline_trace(tmp_path / "t.rpt")
    argv = [
        "sweep",
        str(trace),
        "--target",
        "http://engine",
        "--concurrency",
        "4,1",
        "-o",
        str(tmp_path / "c"),
    ]
    assert main(argv) == 0
    assert [c[c.index("--max-concurrency") + 1] for c in calls] == ["1", "4"]
    assert all(float(c[c.index("--speed") + 1]) >= 1e5 for c in calls)  # every request due at once


@pytest.mark.parametrize("given", [["--speed", "3"], ["--speed=3"], ["-o", "x.rpr"]])
def test_replay_args_that_would_override_the_step_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: list[str]
) -> None:
    trace = write_baseline_trace(tmp_path / "t.rpt")
    argv = ["sweep", str(trace), "--target", "http://e", "--speeds", "1", "--replay-args", *given]
    assert main(argv) == 2
    assert "--replay-args must not set" in capsys.readouterr().err


def test_max_concurrency_is_refused_beside_concurrency_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_baseline_trace(tmp_path / "t.rpt")
    argv = ["sweep", str(trace), "--target", "http://e", "--concurrency", "1,2", "--replay-args",
            "--max-concurrency", "8"]  # fmt: skip
    assert main(argv) == 2
    assert "must not set --max-concurrency" in capsys.readouterr().err


def test_a_replay_step_that_exits_1_with_its_result_written_is_a_step(tmp_path: Path) -> None:
    """Too many errors at a high speed is what a sweep looks for, not a reason to stop it."""
    out = tmp_path / "speed-8.rpr"
    script = f"import pathlib, sys; pathlib.Path({str(out)!r}).write_bytes(b'x'); sys.exit(1)"
    sweep_command.run_replay([sys.executable, "-c", script, "-o", str(out)])
    with pytest.raises(RunAborted, match="replay step failed"):
        sweep_command.run_replay([sys.executable, "-c", "import sys; sys.exit(1)", "-o", str(tmp_path / "x")])


def test_a_step_shows_its_progress_lines_as_they_come(capsys: pytest.CaptureFixture[str]) -> None:
    script = (
        "import sys; print('replay: 0:10 elapsed, ETA 0:05  sent 9/10', file=sys.stderr);"
        "print('a note', file=sys.stderr); sys.exit(2)"
    )
    with pytest.raises(RunAborted, match="replay step failed: a note"):
        sweep_command.run_replay([sys.executable, "-c", script])
    assert capsys.readouterr().err == "sweep: replay: 0:10 elapsed, ETA 0:05  sent 9/10\n"
