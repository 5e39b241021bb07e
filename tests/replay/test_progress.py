"""Live progress: running figures from runner readings, and the terminal / log / no display."""

from __future__ import annotations

import asyncio
import io
import time

import pytest

from replayproxy.replay import progress
from replayproxy.replay.progress import LogDisplay, Reading, RichDisplay, Snapshot, Tracker

S = 1_000_000_000


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Recorder:
    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []
        self.closed: list[Snapshot | None] = []

    def update(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)

    def close(self, snapshot: Snapshot | None) -> None:
        self.closed.append(snapshot)


def test_auto_is_a_panel_on_a_terminal_and_log_lines_elsewhere() -> None:
    assert progress.resolve("auto", False, Terminal()) == "tty"
    assert progress.resolve("auto", False, io.StringIO()) == "log"
    assert progress.resolve("tty", True, Terminal()) == "none"  # --quiet wins
    with pytest.raises(ValueError, match="invalid choice: 'fancy'"):
        progress.resolve("fancy", False, io.StringIO())


def test_tracker_reports_elapsed_eta_rates_and_running_percentiles() -> None:
    now = [0]
    shown = Recorder()
    # 20 requests scheduled 1 s apart: the window lasts 19 s.
    tracker = Tracker(shown, [i * S for i in range(20)], clock=lambda: now[0])
    now[0] = 100 * S + 5 * S  # 5 s after the start at 100 s
    tracker.update(Reading(20, 6, 4, 1, [1_000_000, 3_000_000], [100_000_000, 300_000_000]), 100 * S)
    s = shown.snapshots[-1]
    assert (s.elapsed_s, s.eta_s, s.sent, s.in_flight, s.errors) == (5.0, 14.0, 6, 2, 1)
    assert s.offered_rps == pytest.approx(6 / 5) and s.achieved_rps == pytest.approx(4 / 5)
    assert s.ttft_p50_ms == pytest.approx(200.0) and s.lag_p99_ms == pytest.approx(2.98)
    now[0] = 100 * S + 6 * S
    tracker.update(Reading(20, 7, 6, 1, [], [500_000_000]), 100 * S)
    s = shown.snapshots[-1]
    assert s.ttft_p50_ms == pytest.approx(300.0) and s.lag_p99_ms is None  # lags are per reading
    tracker.close()
    tracker.close()
    assert shown.closed == [s]


def test_without_a_display_the_tracker_does_nothing() -> None:
    tracker = Tracker(None, [0, S], clock=lambda: 0)
    tracker.update(Reading(2, 1, 0, 0, [], []), 0)
    tracker.close()
    assert tracker.last is None


def _snapshot(elapsed_s: float) -> Snapshot:
    return Snapshot(elapsed_s, 30.0, 100, 40, 30, 2, 4.0, 3.0, 120.0, 250.0, 0.4)


def test_log_display_prints_a_plain_line_every_ten_seconds_and_a_last_one() -> None:
    out = io.StringIO()
    display = LogDisplay("replay", out)
    for elapsed in (1.0, 9.0, 10.5, 12.0, 21.0):
        display.update(_snapshot(elapsed))
    display.close(_snapshot(22.0))
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["0:10", "0:21", "0:22"]
    assert lines[0] == (
        "replay: 0:10 elapsed, ETA 0:19  sent 40/100  done 30  in flight 10  errors 2  "
        "req/s 3.0 of 4.0 offered  TTFT p50 120 ms p95 250 ms  lag p99 0.40 ms"
    )
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_rich_display_draws_the_figures_on_a_terminal() -> None:
    out = Terminal()
    display = RichDisplay("replay", out)
    display.update(_snapshot(5.0))
    display.close(_snapshot(6.0))
    text = out.getvalue()
    assert "\x1b[" in text  # drawn in place with terminal codes
    for figure in ("ETA 0:24", "sent 40/100", "in flight 10", "errors 2", "3.0 of 4.0 offered", "p95 250 ms",
                   "lag p99 0.40 ms"):  # fmt: skip
        assert figure in text


def test_a_stage_of_unknown_length_logs_start_ticks_and_end(capsys: pytest.CaptureFixture[str]) -> None:
    with progress.stage("log", "import", "reading big.jsonl", every_s=0.05):
        time.sleep(0.3)
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("import: reading big.jsonl: done in 0:00")
    assert len(lines) >= 3 and all(
        line.startswith("import: reading big.jsonl: 0:00 so far") for line in lines[:-1]
    )
    with progress.stage("log", "import", "quick", every_s=5.0), progress.stage("none", "import", "off", 0.01):
        time.sleep(0.05)
    assert capsys.readouterr().err == ""  # shorter than a tick, or none: nothing


def test_progress_is_drawn_in_a_gap_between_sends_but_never_skipped() -> None:
    from replayproxy import clock
    from replayproxy.replay import sender

    class Busy:  # a send always due in 1 ms: the reporter waits for a gap, then draws anyway
        @property
        def next_deadline_ns(self) -> int:
            return clock.now_ns() + 1_000_000

    async def main() -> float:
        drawn: list[int] = []
        started = clock.now_ns()
        reporter = sender._report_progress(Busy(), lambda r: drawn.append(clock.now_ns()))  # type: ignore[arg-type]
        task = asyncio.ensure_future(reporter)
        while not drawn:
            await asyncio.sleep(0.05)
        task.cancel()
        return (drawn[0] - started) / 1e9

    waited = asyncio.run(main())
    assert 1.0 + sender.PROGRESS_WAIT_S * 0.9 <= waited < 3.0
