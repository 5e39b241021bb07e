"""Shared import machinery: id chains, bad-line accounting, column writing equal to row writing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replayproxy.formats.chained_hashes import ChainedHashes
from replayproxy.formats.importing import (
    BadLines,
    Imported,
    ImportFormatError,
    iter_json_lines,
    write_imported,
)
from replayproxy.shape import RequestShape
from replayproxy.trace import TraceHeader, write_columns, write_trace
from tests.trace.helpers import shapes_of


def test_bad_lines_raise_or_count() -> None:
    strict, lenient = BadLines("f", skip=False), BadLines("f", skip=True)
    with pytest.raises(ImportFormatError, match=r"^f:7: why \(--skip-bad skips such lines\)$"):
        strict(7, "why")
    lenient(7, "why")
    lenient(9, "other")
    assert lenient.count == 2 and lenient.first == "f:7: why"


def read_all(path: Path, bad: BadLines) -> tuple[list[object], list[int]]:
    rows: list[object] = []
    numbers: list[int] = []
    for batch, batch_numbers in iter_json_lines(path, bad):
        rows += batch
        numbers += batch_numbers
    return rows, numbers


def test_json_lines_fast_and_slow_paths(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    rows, nos = read_all(tmp_path / "a.jsonl", BadLines("a", skip=False))
    assert rows == [{"a": 1}, {"a": 2}] and nos == [1, 2]
    (tmp_path / "b.jsonl").write_text('{"a": 1}\n\n  \n[1]\n{"a": 3}')
    rows, nos = read_all(tmp_path / "b.jsonl", BadLines("b", skip=True))
    assert rows == [{"a": 1}, {"a": 3}] and nos == [1, 5]


def test_write_columns_reads_back_like_write_trace(tmp_path: Path) -> None:
    shapes = [
        RequestShape(
            offset_ns=5, input_tokens=40, output_tokens=3, model="m", prefix_hashes=(1, 2), status=200
        ),
        RequestShape(offset_ns=9, input_tokens=7, model="n", stream=False, error="other", session=3, turn=1),
    ]
    header = TraceHeader(start_wall_ns=0)
    write_trace(tmp_path / "rows.rpt", header, shapes, mono_ns=int, wall_ns=int)
    columns = {
        "offset_ns": np.array([5, 9]),
        "input_tokens": np.array([40, 7]),
        "output_tokens": np.array([3, -1]),
        "model": ["m", "n"],
        "stream": np.array([True, False]),
        "error": np.array(["", "other"], dtype=object),
        "status": np.array([200, 0]),
        "session": np.array([0, 3], np.uint64),
        "turn": np.array([0, 1]),
        "prefix_hashes": (np.array([1, 2], np.uint64), np.array([2, 0])),
    }
    write_columns(tmp_path / "cols.rpt", header, columns, 2, wall_ns=int, frame_records=1)
    assert shapes_of(tmp_path / "cols.rpt") == shapes_of(tmp_path / "rows.rpt") == shapes


def test_write_imported_sorts_rebases_and_keeps_full_blocks(tmp_path: Path) -> None:
    imported = Imported(
        source="test",
        offset_ns=np.array([3_000, 1_000, 2_000]),
        input_tokens=np.array([40, 10, 33]),
        output_tokens=np.array([1, 2, 3]),
        bad=BadLines("x", skip=True),
        hashes=ChainedHashes(16),
        wall_clock=True,
    )
    assert imported.hashes is not None
    imported.hashes.add(np.array([1, 2, 3, 9, 1, 2, 4]), np.array([3, 1, 3]), imported.input_tokens)
    write_imported(imported, tmp_path / "t.rpt", int)
    shapes = shapes_of(tmp_path / "t.rpt")
    assert [s.offset_ns for s in shapes] == [0, 1_000, 2_000] and [s.input_tokens for s in shapes] == [
        10,
        33,
        40,
    ]
    assert [len(s.prefix_hashes) for s in shapes] == [0, 2, 2]  # 16-token blocks: floor(33/16), floor(40/16)
    assert shapes[1].prefix_hashes == shapes[2].prefix_hashes  # ids 1, 2 in both
    assert [s.prefix_units for s in shapes] == [10, 33, 40] and {s.status for s in shapes} == {200}
