"""Azure and BurstGPT CSV exports: read back exactly by our importers and by the consumers' rules."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from replayproxy import cli
from replayproxy.formats import azure, burstgpt
from replayproxy.formats.exporting import ExportOptions
from replayproxy.formats.importing import ImportOptions, write_imported
from replayproxy.formats.trace_csv import write_azure, write_burstgpt
from replayproxy.trace import load
from tests.formats.helpers import DATA, conversation_trace


def test_azure_round_trip_keeps_times_to_100_ns_and_lengths(tmp_path: Path) -> None:
    src = DATA / "azure_conv_2023_head60.csv"
    write_imported(azure.read(src, ImportOptions()), tmp_path / "a.rpt", lambda: 0)
    first = load(tmp_path / "a.rpt")
    result = write_azure(first, tmp_path / "out.csv", ExportOptions())
    assert result.rows == 60
    original = src.read_text().splitlines()
    exported = (tmp_path / "out.csv").read_text().splitlines()
    assert exported == [line.strip() for line in original]  # byte-identical rows, 7 fractional digits
    write_imported(azure.read(tmp_path / "out.csv", ImportOptions()), tmp_path / "b.rpt", lambda: 0)
    second = load(tmp_path / "b.rpt")
    assert second.headers[0].start_wall_ns == first.headers[0].start_wall_ns
    for name in ("offset_ns", "input_tokens", "output_tokens"):
        assert np.array_equal(first.scalar[name], second.scalar[name]), name


def test_burstgpt_export_reads_back_and_passes_the_readers_rules(tmp_path: Path) -> None:
    cols = load(conversation_trace(tmp_path / "t.rpt"))
    out = tmp_path / "b.csv"
    result = write_burstgpt(cols, out, ExportOptions(model="m"))
    with open(out, newline="") as stream:
        rows = list(csv.DictReader(stream))
    # vLLM keeps rows with Model == "GPT-4" and Response tokens > 0; AIPerf needs these three columns.
    assert len([r for r in rows if r["Model"] == "GPT-4" and int(r["Response tokens"]) > 0]) == 6
    assert [float(r["Timestamp"]) for r in rows] == [0.0, 0.25, 0.9, 1.5, 1.5, 3.001]
    imported = burstgpt.read(out, ImportOptions())
    assert imported.input_tokens.tolist() == cols.input_tokens.tolist()
    assert imported.output_tokens.tolist() == cols.output_tokens.tolist()
    assert any("--dataset-name burstgpt" in n for n in result.notes)
    assert any("burst_gpt_trace" in n and "ignore_eos:true" in n for n in result.notes)


@pytest.mark.parametrize("fmt", ["azure", "burstgpt"])
def test_csv_exports_stream_from_the_command(
    tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = conversation_trace(tmp_path / "t.rpt")
    out = tmp_path / f"{fmt}.csv"
    assert cli.main(["export", str(trace), "-f", fmt, "-o", str(out)]) == 0
    assert "wrote 6 requests" in capsys.readouterr().out
    assert cli.main(["import", str(out), "-f", fmt, "-o", str(tmp_path / "back.rpt")]) == 0
    assert load(tmp_path / "back.rpt").input_tokens.tolist() == load(trace).input_tokens.tolist()
