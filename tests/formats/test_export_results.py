"""`replayproxy export RESULT.rpr`: one row per request, loaded the way users load vLLM bench / AIPerf
per-request files (pandas, pyarrow)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from replayproxy import cli
from replayproxy.results import RESULT_FIELDS, ROW_KINDS
from tests.report.helpers import result, write_run


def two_runs(tmp_path: Path) -> list[str]:
    a = write_run(tmp_path / "a.rpr", [result(0, ttft_ms=12.5, e2e_ms=80.0, gaps_us=[1500, 2500],
                                              completion_tokens=3),
                                       result(1, error="http_5xx", e2e_ms=4.0)], label="vllm")  # fmt: skip
    b = write_run(tmp_path / "b.rpr", [result(0, ttft_ms=20.0, e2e_ms=90.0)], label="sglang")
    return [str(a), str(b)]


def load(path: Path, fmt: str) -> pd.DataFrame:
    if fmt == "csv":
        return pd.read_csv(path, keep_default_na=True)
    if fmt == "jsonl":
        return pd.read_json(path, lines=True)
    return pq.read_table(path).to_pandas()


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_each_format_loads_in_pandas_with_every_field_and_ms_times(
    tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / f"rows.{fmt}"
    assert cli.main(["export", *two_runs(tmp_path), "--format", fmt, "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote 3 requests of 2 run(s) to {out} ({fmt})"
    frame = load(out, fmt)
    assert list(frame.columns) == list(ROW_KINDS) and set(RESULT_FIELDS) <= set(frame.columns)
    assert frame["run"].tolist() == ["vllm", "vllm", "sglang"]
    assert frame["ttft_ms"][0] == pytest.approx(12.5) and frame["ttft_ns"][0] == 12_500_000
    assert math.isnan(frame["ttft_ms"][1]) and frame["ttft_ns"][1] == -1  # unknown: null in ms
    assert frame["error"][1] == "http_5xx" and frame["status"][1] == 500
    gaps = frame["chunk_gaps_ms"][0]
    if fmt == "csv":  # lists as space-separated numbers, as in the trace CSV export
        assert gaps == "1.5 2.5" and frame["chunk_gaps_us"][0] == "1500 2500"
    else:
        assert list(gaps) == [1.5, 2.5] and list(frame["chunk_gaps_us"][0]) == [1500, 2500]


def test_parquet_keeps_the_types_even_where_every_value_is_null(tmp_path: Path) -> None:
    out = tmp_path / "rows.parquet"
    run = write_run(tmp_path / "x.rpr", [result(0, error="timeout")], label="x")
    assert cli.main(["export", str(run), "--format", "parquet", "-o", str(out)]) == 0
    schema = pq.read_schema(out)
    assert str(schema.field("ttft_ms").type) == "double"
    assert str(schema.field("chunk_gaps_us").type.value_type) == "uint32"


def test_a_trace_only_format_is_one_line_for_result_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["export", *two_runs(tmp_path), "--format", "mooncake", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "replayproxy export: error: --format: invalid choice for result files: 'mooncake' "
        "(choose from csv, jsonl, parquet)"
    )
