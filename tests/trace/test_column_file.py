"""Column files (replayproxy/trace/column_file.py), the container of traces and results: rows in,
typed numpy columns out, side records and the footer kept apart, a bad batch or header refused
with the file named."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replayproxy import trace
from replayproxy.errors import FileAccessError
from replayproxy.shape import RequestShape
from replayproxy.trace import ReadReport, TraceFormatError, TraceHeader, expand_paths
from replayproxy.trace.column_file import ColumnFileWriter, read_column_file, read_each, with_defaults
from tests.trace.helpers import batch, exact, frames_with_header, shapes_of, write

KINDS = {
    "at": "i8",
    "id": "u8",
    "ok": "b1",
    "name": "str",
    "settings": "obj",
    "hashes": "ragged:u8",
    "gaps": "ragged:u4",
}


def header(format_name: str = "demo", **changes: Any) -> dict[str, Any]:
    return {
        "type": "header",
        "format": format_name,
        "version": 1,
        "fields": list(KINDS),
        "kinds": KINDS,
    } | changes


ROWS = [
    (-5, 2**64 - 1, True, "a", {}, np.array([1, 2], "<u8").tobytes(), b""),
    (7, 0, False, "b", {"t": 0.5}, b"", np.array([3], "<u4").tobytes()),
    (9, 3, True, "a", {"t": 1}, np.array([2**63], "<u8").tobytes(), np.array([4, 5], "<u4").tobytes()),
]


def test_every_kind_round_trips_with_side_records_and_footer(tmp_path: Path) -> None:
    out = ColumnFileWriter(tmp_path / "f.demo", header(), level=3, exclusive=True)
    out.add(ROWS[0])
    out.add(ROWS[1])
    assert out.pending == 2
    out.write_side_record({"type": "note", "value": 1})  # flushes the rows before it
    out.add(ROWS[2])
    out.close({"end": 42})
    assert out.records == 3 and out.bytes_written == (tmp_path / "f.demo").stat().st_size
    extras: dict[str, list[dict[str, Any]]] = {}
    footer: dict[str, Any] = {}
    report = ReadReport()
    data = read_column_file(tmp_path / "f.demo", "demo", 1, report, extras=extras, footer=footer)
    assert data.n == 3 and report.records == 3 and report.files == 1 and report.frames == 5
    assert data.columns["at"].tolist() == [-5, 7, 9] and data.columns["at"].dtype == np.int64
    assert data.columns["id"].tolist() == [2**64 - 1, 0, 3] and data.columns["id"].dtype == np.uint64
    assert data.columns["ok"].tolist() == [True, False, True]
    assert data.columns["name"].tolist() == ["a", "b", "a"]
    assert [repr(s) for s in data.columns["settings"]] == ["{}", "{'t': 0.5}", "{'t': 1}"]
    flat, lengths = data.ragged["hashes"]
    assert flat.tolist() == [1, 2, 2**63] and lengths.tolist() == [2, 0, 1]
    flat, lengths = data.ragged["gaps"]
    assert flat.tolist() == [3, 4, 5] and lengths.tolist() == [0, 1, 2]
    assert extras == {"note": [{"type": "note", "value": 1}]}
    assert footer == {"type": "footer", "records": 3, "end": 42} and report.footers == 1


def test_a_file_of_another_format_or_a_newer_version_is_refused(tmp_path: Path) -> None:
    ColumnFileWriter(tmp_path / "f.demo", header(), level=3, exclusive=False).close({})
    with pytest.raises(TraceFormatError, match="is a 'demo' file, expected 'other'"):
        read_column_file(tmp_path / "f.demo", "other", 1, ReadReport())
    with pytest.raises(TraceFormatError, match=r"format version 1 is newer than this reader \(0\)"):
        read_column_file(tmp_path / "f.demo", "demo", 0, ReadReport())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kinds": KINDS | {"at": "f16"}}, "gives field 'at' no known kind"),
        ({"fields": ["at", "at"]}, "fields repeat a name"),
        ({"fields": "at"}, "field list is not a list of names"),
        ({"fields": ["name"], "kinds": {"name": "str"}}, "declares no fixed-width column"),
    ],
)
def test_a_header_that_cannot_describe_its_columns_is_refused(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    path = tmp_path / "f.demo"
    path.write_bytes(frames_with_header(header(**changes), []))
    with pytest.raises(TraceFormatError, match=message) as info:
        read_column_file(path, "demo", 1, ReadReport())
    assert str(path) in str(info.value)


def test_a_field_of_another_kind_than_the_reader_expects_is_refused(tmp_path: Path) -> None:
    ColumnFileWriter(tmp_path / "f.demo", header(), level=3, exclusive=False).close({})
    with pytest.raises(TraceFormatError, match="declares field 'id' as u8, expected i8"):
        read_column_file(tmp_path / "f.demo", "demo", 1, ReadReport(), expected={"id": "i8"})


def _big_file(path: Path) -> np.ndarray:
    """A file past the size that is memory-mapped rather than read (random hashes do not compress)."""
    hashes = np.random.default_rng(1).integers(0, 2**63, 200_000, dtype=np.uint64)
    out = ColumnFileWriter(path, header(), level=3, exclusive=False)
    out.add((0, 0, True, "a", {}, hashes.astype("<u8").tobytes(), b""))
    out.close({})
    assert path.stat().st_size > 1 << 20
    return hashes


def _mapped(path: Path) -> bool:
    """Whether this process still maps the file (Linux lists every mapping with its file)."""
    return str(path) in Path("/proc/self/maps").read_text()


needs_proc_maps = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="no /proc/self/maps")


@needs_proc_maps
def test_a_large_file_is_unmapped_once_read_and_its_columns_outlive_the_map(tmp_path: Path) -> None:
    path = tmp_path / "big.demo"
    hashes = _big_file(path)
    loaded = read_column_file(path, "demo", 1, ReadReport())
    assert not _mapped(path)
    path.unlink()  # the columns are copies: they stay readable with the file gone
    flat, lengths = loaded.ragged["hashes"]
    assert lengths.tolist() == [len(hashes)] and np.array_equal(flat, hashes)


@needs_proc_maps
def test_a_large_file_is_unmapped_when_reading_it_fails(tmp_path: Path) -> None:
    """The error's traceback holds the reader's frame: the map must be closed, not left to it."""
    path = tmp_path / "big.demo"
    _big_file(path)
    with pytest.raises(TraceFormatError, match="expected i8") as refused:
        read_column_file(path, "demo", 1, ReadReport(), expected={"id": "i8"})
    assert refused.value.__traceback__ is not None and not _mapped(path)


def test_an_exclusive_writer_does_not_overwrite(tmp_path: Path) -> None:
    ColumnFileWriter(tmp_path / "f.demo", header(), level=3, exclusive=True).close({})
    with pytest.raises(FileAccessError, match="File exists") as refused:
        ColumnFileWriter(tmp_path / "f.demo", header(), level=3, exclusive=True)
    assert refused.value.errno == errno.EEXIST


def test_abandoning_removes_a_file_without_records_and_keeps_one_with_records(tmp_path: Path) -> None:
    empty = ColumnFileWriter(tmp_path / "empty.demo", header(), level=3, exclusive=False)
    empty.abandon()
    assert not (tmp_path / "empty.demo").exists()
    kept = ColumnFileWriter(tmp_path / "kept.demo", header(), level=3, exclusive=False)
    kept.add(ROWS[0])
    kept.flush()
    kept.add(ROWS[1])  # buffered, never written
    kept.abandon()
    report = ReadReport()
    assert read_column_file(tmp_path / "kept.demo", "demo", 1, report).n == 1 and report.footers == 0


def test_malformed_batch_is_skipped(tmp_path: Path) -> None:
    good = batch([RequestShape(offset_ns=i) for i in range(2)])
    short = dict(good, columns=list(good["columns"]))
    short["columns"][0] = short["columns"][0].tobytes()[
        :8
    ]  # offset_ns column holds one row, the batch says two
    path = tmp_path / "bad-batch.rpt"
    path.write_bytes(frames_with_header(TraceHeader(start_wall_ns=0).to_record(), [short, good]))
    loaded = trace.load(path)
    assert loaded.offset_ns.tolist() == [0, 1]
    assert any("malformed batch of 2 records" in w for w in loaded.report.warnings)


def test_columns_grow_past_what_the_first_frame_suggests(tmp_path: Path) -> None:
    """The loader sizes ragged columns from the first batch; later, denser frames must still fit."""
    sparse = [RequestShape(offset_ns=i) for i in range(50)]
    dense = [RequestShape(offset_ns=50 + i, prefix_hashes=tuple(range(i, i + 300)), chunk_gaps_us=(7,) * i)
             for i in range(150)]  # fmt: skip
    path = write(tmp_path / "t.rpt", sparse + dense, frame_records=50)
    loaded = trace.load(path)
    assert len(loaded) == 200 and loaded.report.frames == 1 + 4 + 1
    assert loaded.hashes_of(0).tolist() == [] and loaded.hashes_of(199).tolist() == list(range(149, 449))
    assert len(loaded.prefix_hashes) == 150 * 300 and loaded.chunk_gaps_us.tolist() == [7] * sum(range(150))
    assert [exact(s) for s in shapes_of(path)] == [exact(s) for s in sparse + dense]


def test_with_defaults_fills_missing_fields_and_refuses_a_missing_required_one(tmp_path: Path) -> None:
    out = ColumnFileWriter(tmp_path / "f.demo", header(fields=["at"], kinds={"at": "i8"}), 3, exclusive=False)
    out.add((1,))
    out.add((2,))
    out.close({})
    data = read_column_file(tmp_path / "f.demo", "demo", 1, ReadReport())
    filled = with_defaults(
        data, KINDS, {"id": 7, "ok": True, "name": "-", "settings": {}, "hashes": (), "gaps": ()}
    )
    assert filled.columns["id"].tolist() == [7, 7] and filled.columns["ok"].tolist() == [True, True]
    assert filled.columns["name"].tolist() == ["-", "-"] and filled.ragged["hashes"][1].tolist() == [0, 0]
    data = read_column_file(tmp_path / "f.demo", "demo", 1, ReadReport())
    with pytest.raises(TraceFormatError, match="lacks the required field 'id'"):
        with_defaults(data, KINDS, {})


def test_of_several_files_an_unreadable_one_is_skipped_and_reported(tmp_path: Path) -> None:
    good = write(tmp_path / "a.rpt", [RequestShape(offset_ns=1)])
    (tmp_path / "b.rpt").write_bytes(b"not a trace")
    report = ReadReport()
    read = read_each(
        [good, tmp_path / "b.rpt"],
        lambda path: read_column_file(path, trace.FORMAT_NAME, trace.FORMAT_VERSION, report),
        report,
    )
    assert [data.path for data in read] == [good] and report.skipped_files == 1
    assert report.warnings == [f"{tmp_path / 'b.rpt'}: skipped: not a replayproxy file (bad magic)"]


def test_a_single_unreadable_file_raises_its_own_error_and_all_unreadable_say_so(tmp_path: Path) -> None:
    def refuse(path: Path) -> None:
        raise TraceFormatError(f"{path}: broken")

    with pytest.raises(TraceFormatError, match="x.rpt: broken"):
        read_each([tmp_path / "x.rpt"], refuse, ReadReport())
    with pytest.raises(TraceFormatError, match="no readable file among 2: .*x.rpt: broken"):
        read_each([tmp_path / "x.rpt", tmp_path / "y.rpt"], refuse, ReadReport())


def test_paths_expand_directories_and_globs_in_name_order(tmp_path: Path) -> None:
    for name in ("b.rpt", "a.rpt", "c.rpr"):
        (tmp_path / name).write_bytes(b"")
    assert expand_paths([tmp_path]) == [tmp_path / "a.rpt", tmp_path / "b.rpt"]
    assert expand_paths([tmp_path], suffix=".rpr") == [tmp_path / "c.rpr"]
    assert expand_paths([str(tmp_path / "*.rp?")]) == [tmp_path / n for n in ("a.rpt", "b.rpt", "c.rpr")]
    assert expand_paths([tmp_path / "c.rpr"]) == [tmp_path / "c.rpr"]  # a named file, whatever its suffix
    with pytest.raises(FileNotFoundError, match="no such file"):
        expand_paths([tmp_path / "missing.rpt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .rpt files in"):
        expand_paths([tmp_path / "empty"])
