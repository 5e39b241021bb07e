"""`replayproxy demo`'s failure paths: a failed stage is its own output, then one error line."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from replayproxy import cli, demo
from replayproxy.errors import RunAborted
from replayproxy.launch import run_server


def test_a_server_that_does_not_start_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "_cli", lambda *argv, show=False: None)
    monkeypatch.setattr(demo, "_loopback", lambda command, argv: ["--no-such-option"])
    assert cli.main(["demo", "--keep", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "replayproxy demo: error: the production engine (simulated) did not start"
    assert "did not start listening" in err and "--no-such-option" in err


def test_a_failing_stage_shows_its_output_and_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RunAborted, match=r"'replayproxy report' failed with exit status 2"):
        demo._cli("report", "/nonexistent/run.rpr")
    assert "no such file: /nonexistent/run.rpr" in capsys.readouterr().err


def test_without_keep_only_the_printed_report_survives(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.rpt").write_bytes(b"x")
    (tmp_path / "workload.rpt").write_bytes(b"x")
    (tmp_path / demo.REPORT_NAME).write_text("<html></html>")
    demo._remove_all_but_the_report(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [demo.REPORT_NAME]


def test_a_kept_directory_is_cleared_of_the_previous_run_but_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "trace-1.rpt").write_bytes(b"old")
    (tmp_path / "prefix-cache-on.rpr").write_bytes(b"old")
    (tmp_path / "notes.txt").write_text("mine")
    demo._clear_previous_run(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_without_matplotlib_the_report_is_text_only_and_says_how_to_get_html(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(demo, "_cli", lambda *argv, show=False: calls.append(argv))
    monkeypatch.setattr(demo, "_server", _fake_server)
    real_find_spec = demo.importlib.util.find_spec
    monkeypatch.setattr(
        demo.importlib.util, "find_spec", lambda name: None if name == "matplotlib" else real_find_spec(name)
    )
    assert cli.main(["demo", "--keep", str(tmp_path)]) == 0
    report = [argv for argv in calls if argv[0] == "report"][-1]
    assert "--html" not in report and "--baseline" in report
    replays = [argv for argv in calls if argv[0] == "replay"]
    assert len(replays) == 3 and all(argv[argv.index("--progress") + 1] == "log" for argv in replays)
    assert "demo: HTML report skipped: its plots need matplotlib" in capsys.readouterr().out


@contextlib.contextmanager
def _fake_server(command: str, what: str, *argv: str) -> Iterator[str]:
    yield "http://127.0.0.1:9"


def test_a_server_started_nicer_yields_the_cpu_to_its_client() -> None:
    with run_server(["replayproxy.sim", "--host", "127.0.0.1", "--port", "0"], niceness=5) as server:
        assert os.getpriority(os.PRIO_PROCESS, server.process.pid) == os.getpriority(os.PRIO_PROCESS, 0) + 5


def test_ci_runs_the_demo_twice_from_a_clean_venv_before_the_test_extras() -> None:
    script = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    demo_at, test_at = script.index('make demo VENV="$demo_venv"'), script.index("make test")
    assert demo_at < test_at and 'demo_venv="$scratch/venv"' in script and "for run in 1 2" in script
    for needle in (
        '"bottleneck"',
        '"deprecated"',
        '"in 1 file(s)"',
        '"Verdict"',
        '"goodput req/s"',
    ):
        assert needle in script
