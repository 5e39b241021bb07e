"""The CLI's error boundary: user errors are one line and exit 2; anything else shows as a bug."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import tempfile
from pathlib import Path

import pytest

from replayproxy import cli, errors
from replayproxy.trace import mapped
from tests.formats.helpers import conversation_trace


def _plant(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """Make `replayproxy report`'s handler raise `error` once its arguments are parsed."""
    module = importlib.import_module(cli.COMMANDS["report"].module)

    def run(args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(module, "run", run)


def test_a_planted_key_error_is_shown_as_a_bug_not_a_user_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _plant(monkeypatch, KeyError("p99_ms"))
    assert cli.main(["report", str(tmp_path / "a.rpr")]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "replayproxy report: internal error (a bug): KeyError: 'p99_ms'; run with -v for the traceback"
    ]


def test_verbose_prints_the_traceback_of_a_bug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _plant(monkeypatch, KeyError("p99_ms"))
    assert cli.main(["-v", "report", str(tmp_path / "a.rpr")]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "raise error" in err
    assert err.strip().splitlines()[-1] == "replayproxy report: internal error (a bug): KeyError: 'p99_ms'"


@pytest.mark.parametrize(
    "error",
    [
        errors.BadOption("--resamples must be at least 100"),
        errors.BadInputFile("a.rpr: not a result file"),
        errors.MissingFile("no such file: a.rpr"),
        errors.TargetUnreachable("cannot reach target http://127.0.0.1:9"),
    ],
    ids=type,
)
def test_user_errors_are_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, error: Exception
) -> None:
    _plant(monkeypatch, error)
    assert cli.main(["report", str(tmp_path / "a.rpr")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"replayproxy report: error: {error}"]


@pytest.mark.parametrize("builtin", [ValueError("bad"), OSError("disk"), LookupError("gone")], ids=type)
def test_plain_builtins_are_not_taken_for_user_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, builtin: Exception
) -> None:
    _plant(monkeypatch, builtin)
    assert cli.main(["report", str(tmp_path / "a.rpr")]) == 1
    assert "internal error (a bug)" in capsys.readouterr().err


def test_user_file_names_the_file_and_keeps_the_cause(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "a.json"
    with pytest.raises(errors.FileAccessError, match=r"a\.json: No such file or directory") as caught:
        with errors.user_file(missing):
            missing.read_bytes()
    assert isinstance(caught.value.__cause__, FileNotFoundError)
    assert isinstance(caught.value, OSError)  # callers that catch OSError still do


def test_a_full_disk_for_temporary_files_is_one_line_naming_where_they_go(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An export keeps long columns in temporary files: a full disk there is the user's to fix."""
    trace = conversation_trace(tmp_path / "t.rpt")

    def full(fd: int, data: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(mapped.os, "pwrite", full)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert cli.main(["export", str(trace), "-f", "mooncake", "-o", str(tmp_path / "out.jsonl")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"replayproxy export: error: No space left on device; temporary files go to {tmp_path}"
        " (set TMPDIR to a disk with room)"
    ]
