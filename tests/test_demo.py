"""`replayproxy demo`'s failure paths: a failed stage is its own output, then one error line."""

from __future__ import annotations

from pathlib import Path

import pytest

from replayproxy import cli, demo


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
    with pytest.raises(cli.CliError, match=r"'replayproxy report' failed with exit status 2"):
        demo._cli("report", "/nonexistent/run.rpr")
    assert "no such file: /nonexistent/run.rpr" in capsys.readouterr().err


def test_without_keep_only_the_printed_report_survives(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.rpt").write_bytes(b"x")
    (tmp_path / "workload.rpt").write_bytes(b"x")
    (tmp_path / demo.REPORT_NAME).write_text("<html></html>")
    demo._remove_all_but_the_report(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [demo.REPORT_NAME]
