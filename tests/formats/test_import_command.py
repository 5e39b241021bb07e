"""`replayproxy import`: the formats table in --help, one-line errors, --skip-bad counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from replayproxy import cli
from replayproxy.formats.registry import importers
from replayproxy.trace import load
from tests.cli import run_cli
from tests.formats.helpers import DATA


def test_help_lists_the_import_formats() -> None:
    out = run_cli("import", "--help")
    assert out.returncode == 0
    for name, fmt in importers().items():
        assert f"  {name}" in out.stdout and fmt.help[:30] in out.stdout
    listed = out.stdout.split("formats:")[1].split("examples:")[0]
    assert "csv " not in listed  # export-only formats are not offered


def test_import_writes_a_trace_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.rpt"
    code = cli.main(["import", str(DATA / "azure_conv_2023_head60.csv"), "--format", "azure", "-o", str(out)])
    assert code == 0 and len(load(out)) == 60
    assert "imported 60 requests" in capsys.readouterr().out


def test_bad_line_is_one_line_and_exit_2_unless_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "m.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1}\n{"timestamp": 1}\n')
    args = ["import", str(src), "-f", "mooncake", "-o", str(tmp_path / "t.rpt")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{src}:2: no input_length" in err and "--skip-bad" in err
    assert cli.main([*args, "--skip-bad"]) == 0
    out = capsys.readouterr().out
    assert "imported 1 requests" in out and "skipped 1 malformed lines; first: " in out


def test_unknown_format_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["import", "x", "-f", "sharegpt", "-o", "y"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'sharegpt'" in err and err.count("\n") == 1
    assert "agentic-mooncake, azure, bailian, burstgpt, copilot, dynamo, jsonl, mooncake" in err
    assert cli.main(["import", "x", "-f", "csv", "-o", "y"]) == 2  # export-only
    assert "invalid choice: 'csv'" in capsys.readouterr().err


def test_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["import", str(tmp_path / "nope.csv"), "-f", "azure", "-o", str(tmp_path / "t.rpt")]) == 2
    assert "No such file" in capsys.readouterr().err
