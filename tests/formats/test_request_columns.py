"""csv and parquet exports: one row per request with the documented columns."""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow.parquet as pq

from replayproxy.formats import csv_format, parquet_format
from replayproxy.formats.exporting import ExportOptions
from replayproxy.formats.request_columns import COLUMNS
from replayproxy.trace import load
from tests.formats.helpers import conversation_trace

DOCS = Path(__file__).resolve().parents[2] / "docs" / "formats.md"


def test_csv_has_one_row_per_request_and_every_column(tmp_path: Path) -> None:
    cols = load(conversation_trace(tmp_path / "t.rpt"))
    csv_format.write(cols, tmp_path / "t.csv", ExportOptions())
    with open(tmp_path / "t.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(cols) == 6 and list(rows[0]) == list(COLUMNS)
    assert [int(r["input_tokens"]) for r in rows] == cols.input_tokens.tolist()
    assert rows[2]["arrival_s"] == "0.9" and rows[0]["stream"] == "true" and rows[0]["sampling"] == "{}"
    assert [len(r["prefix_hashes"].split()) for r in rows] == [int(r["prefix_blocks"]) for r in rows]
    assert rows[0]["prefix_hashes"].split()[0] == rows[1]["prefix_hashes"].split()[0]


def test_parquet_keeps_types_and_lists(tmp_path: Path) -> None:
    cols = load(conversation_trace(tmp_path / "t.rpt"))
    result = parquet_format.write(cols, tmp_path / "t.parquet", ExportOptions())
    table = pq.read_table(tmp_path / "t.parquet")
    assert table.num_rows == 6 and table.column_names == list(COLUMNS)
    assert str(table.schema.field("prefix_hashes").type.value_type) == "uint64"
    assert table.column("prefix_hashes")[0].as_py() == cols.hashes_of(0).tolist()
    assert table.column("session").to_pylist()[0] == 11 and "16-token blocks" in result.notes[0]


def test_every_column_is_documented() -> None:
    text = DOCS.read_text()
    assert all(f"`{name}`" in text for name in COLUMNS)
