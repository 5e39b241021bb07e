"""Reading traces (replayproxy/trace/columns.py): every field back in arrival order across files, as
typed numpy columns; older layouts filled with defaults, newer fields ignored; golden files of
every format version keep loading."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayproxy import trace
from replayproxy.shape import FIELD_KINDS, FIELDS, RequestShape
from replayproxy.trace import TraceFormatError, TraceHeader
from replayproxy.trace.column_file import CODED_KINDS, NUMERIC_KINDS, RAGGED_KINDS
from replayproxy.trace.columns import RAGGED
from tests.trace.helpers import (
    FakeClock,
    batch,
    column_value,
    exact,
    frames_with_header,
    shapes,
    shapes_of,
    write,
)

GOLDEN = Path(__file__).parents[1] / "data" / "trace-v1-golden.rpt"
GOLDEN_V2 = Path(__file__).parents[1] / "data" / "trace-v2-golden.rpt"


def test_the_record_layout_has_one_field_list_with_a_kind_for_every_field() -> None:
    assert tuple(FIELD_KINDS) == FIELDS == RequestShape._fields
    assert set(FIELD_KINDS.values()) <= {*NUMERIC_KINDS, *RAGGED_KINDS, *CODED_KINDS}
    assert {name for name, kind in FIELD_KINDS.items() if kind in RAGGED_KINDS} == set(RAGGED)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(shapes, max_size=12), st.integers(1, 5))
def test_every_field_round_trips(tmp_path: Path, written: list[RequestShape], frame_records: int) -> None:
    path = write(tmp_path / "t.rpt", written, frame_records=frame_records)
    in_order = sorted(written, key=lambda s: s.offset_ns)
    columns = trace.load(path)
    assert len(columns) == len(written)
    for i, shape in enumerate(in_order):
        for name in FIELDS:
            assert repr(column_value(columns, name, i)) == repr(getattr(shape, name)), name
    assert columns.report.warnings == []
    assert columns.report.records == len(written)


def test_column_dtypes_follow_field_kinds(tmp_path: Path) -> None:
    columns = trace.load(
        write(tmp_path / "t.rpt", [RequestShape(offset_ns=5, input_tokens=100, session=2**64 - 1)])
    )
    assert columns.offset_ns.dtype == np.int64 and columns.input_tokens.dtype == np.int64
    assert columns.stream.dtype == np.bool_ and columns.session.dtype == np.uint64
    assert columns.session[0] == 2**64 - 1 and columns.prefix_hashes.dtype == np.uint64
    assert columns.model.dtype == object and columns.message_counts(slice(None)).tolist() == [0]
    with pytest.raises(AttributeError):
        _ = columns.no_such_field


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"hello, this is not a trace at all\n", "not a replayproxy file"),
        (bytes(range(256)) * 4, "not a replayproxy file"),
        (zstandard.ZstdCompressor().compress(b'{"a": 1}\n'), "not a replayproxy file"),
        (struct.pack("<IIII", 0x184D2A5E, 8, 4, 0) + b"abcd", "no header record"),
    ],
)
def test_files_that_are_not_traces_give_one_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.rpt"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message) as info:
        trace.load(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_result_file_is_not_a_trace(tmp_path: Path) -> None:
    from replayproxy.results import ResultWriter, RunHeader

    with ResultWriter(tmp_path / "r.rpr", RunHeader(label="a", target="http://x", start_wall_ns=0)):
        pass
    with pytest.raises(TraceFormatError, match="'replayproxy-result' file, expected 'replayproxy-trace'"):
        trace.load(tmp_path / "r.rpr")


def test_unknown_fields_from_a_newer_minor_writer_are_ignored(tmp_path: Path) -> None:
    header = TraceHeader(start_wall_ns=0).to_record()
    header["fields"] = [*header["fields"], "future_field"]
    header["kinds"]["future_field"] = "i8"
    written = [RequestShape(offset_ns=i, input_tokens=10 + i) for i in range(3)]
    path = tmp_path / "newer.rpt"
    path.write_bytes(frames_with_header(header, [batch(written, {"future_field": ("i8", [99] * 3)})]))
    loaded = trace.load(path)
    assert loaded.input_tokens.tolist() == [10, 11, 12] and loaded.report.warnings == []
    assert "future_field" not in loaded.scalar
    assert [exact(s) for s in shapes_of(path)] == [exact(s) for s in written]


def test_files_with_fewer_fields_load_with_defaults(tmp_path: Path) -> None:
    kept = ("offset_ns", "input_tokens", "prefix_hashes")
    columns = {
        "offset_ns": np.arange(3),
        "input_tokens": 5 * np.arange(3),
        "prefix_hashes": (np.arange(3, dtype=np.uint64), np.ones(3, np.int64)),
    }
    path = tmp_path / "old.rpt"
    trace.write_columns(path, TraceHeader(start_wall_ns=0, fields=kept), columns, 3, wall_ns=lambda: 0)
    loaded = trace.load(path)
    assert loaded.headers[0].fields == kept
    assert loaded.input_tokens.tolist() == [0, 5, 10] and loaded.output_tokens.tolist() == [-1, -1, -1]
    assert loaded.model.tolist() == ["", "", ""] and loaded.stream.tolist() == [True] * 3
    assert loaded.hashes_of(2).tolist() == [2] and len(loaded.chunk_gaps_us) == 0
    assert [s.offset_ns for s in shapes_of(path)] == [0, 1, 2]


def test_files_merge_by_absolute_time(tmp_path: Path) -> None:
    # File a starts 2 s after file b; offsets are relative to each file's own start.
    write(tmp_path / "a.rpt", [RequestShape(offset_ns=t, input_tokens=t) for t in (0, 3 * 10**9)], 12 * 10**9)
    write(
        tmp_path / "b.rpt",
        [RequestShape(offset_ns=t, input_tokens=t) for t in (10**9, 4 * 10**9)],
        10 * 10**9,
    )
    loaded = trace.load([tmp_path / "a.rpt", tmp_path / "b.rpt"])
    assert loaded.offset_ns.tolist() == [10**9, 2 * 10**9, 4 * 10**9, 5 * 10**9]
    assert loaded.input_tokens.tolist() == [10**9, 0, 4 * 10**9, 3 * 10**9]
    assert [h.start_wall_ns for h in loaded.headers] == [10 * 10**9, 12 * 10**9]
    pairs = trace.read_trace_files([tmp_path])  # each file as written, the oldest start first
    assert [header.start_wall_ns for header, _ in pairs] == [10 * 10**9, 12 * 10**9]
    assert [data.columns["offset_ns"].tolist() for _, data in pairs] == [[10**9, 4 * 10**9], [0, 3 * 10**9]]


def test_out_of_order_records_are_sorted_with_their_ragged_fields(tmp_path: Path) -> None:
    # A recorder writes a record when its response ends, so arrival order differs from write order.
    written = [
        RequestShape(offset_ns=t, prefix_hashes=(t,) * (t % 3), chunk_gaps_us=(t,)) for t in (5, 1, 4, 2, 3)
    ]
    loaded = trace.load(write(tmp_path / "t.rpt", written, frame_records=2))
    assert loaded.offset_ns.tolist() == [1, 2, 3, 4, 5]
    assert [loaded.hashes_of(i).tolist() for i in range(5)] == [[1], [2, 2], [], [4], [5, 5]]
    assert loaded.chunk_gaps_us.tolist() == [1, 2, 3, 4, 5] and loaded.chunk_index.tolist() == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]


def test_missing_paths_and_empty_directories_raise(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        trace.load(tmp_path / "missing.rpt")
    with pytest.raises(FileNotFoundError, match="no .rpt files"):
        trace.load(tmp_path)


def test_a_file_with_no_records_loads_empty(tmp_path: Path) -> None:
    loaded = trace.load(write(tmp_path / "t.rpt", []))
    assert len(loaded) == 0 and loaded.prefix_index.tolist() == [0] and loaded.report.footers == 1


def test_equal_looking_sampling_values_keep_their_types(tmp_path: Path) -> None:
    samplings = [{"n": 1}, {"n": True}, {"n": 1.0}, {"t": 0.0}, {"t": -0.0}, {}]
    written = [RequestShape(offset_ns=i, sampling=s) for i, s in enumerate(samplings)]
    path = write(tmp_path / "t.rpt", written)
    assert [repr(s.sampling) for s in shapes_of(path)] == [repr(s) for s in samplings]
    assert [repr(s) for s in trace.load(path).sampling] == [repr(s) for s in samplings]


# --------------------------------------------------------------------------- the golden files


def test_version_1_golden_file_keeps_loading() -> None:
    from tests.data.make_golden import golden_header, golden_shapes

    loaded = trace.load(GOLDEN)
    assert loaded.report.warnings == [] and loaded.report.footers == 1
    (header,) = loaded.headers
    v1_fields = FIELDS[: FIELDS.index("response_bytes") + 1]  # version 1 ended there
    assert header.version == 1 and header.fields == v1_fields
    assert header == replace(golden_header(), created_wall_ns=header.created_wall_ns, fields=v1_fields)
    assert loaded.think_ns.tolist() == [-1, -1, -1] and loaded.parent_id.tolist() == [0, 0, 0]
    expected = golden_shapes()
    assert [exact(s) for s in shapes_of(GOLDEN)] == [exact(s) for s in expected]
    # Values spelled out, so a change to the generator cannot silently move the goal posts.
    assert loaded.input_tokens.tolist() == [1200, 40, 333]
    assert loaded.model.tolist() == ["llama-3-8b", "llama-3-8b", "qwen2-7b"]
    assert loaded.hashes_of(0).tolist() == [0x0123456789ABCDEF, 2**64 - 1]
    assert loaded.sampling[1] == {"temperature": 0.7, "n": True, "stop": True}
    assert loaded.error.tolist() == ["", "", "http_5xx"] and loaded.status.tolist() == [200, 200, 503]


def test_version_2_golden_file_keeps_loading_with_its_turn_links() -> None:
    from tests.data.make_golden import golden_header, golden_shapes

    loaded = trace.load(GOLDEN_V2)
    (header,) = loaded.headers
    v2_fields = FIELDS[: FIELDS.index("tool_chars") + 1]  # the version-2 file was written before request_type
    assert header.version == 2 and header.fields == v2_fields
    assert header == replace(golden_header(2), created_wall_ns=header.created_wall_ns, fields=v2_fields)
    assert set(loaded.request_type.tolist()) == {""}  # a field added later reads as its default
    assert set(loaded.usage_source.tolist()) == {""}
    assert loaded.join_index.tolist() == [0] * (len(loaded) + 1) and not loaded.spawned.any()
    assert [exact(s) for s in shapes_of(GOLDEN_V2)] == [exact(s) for s in golden_shapes(2)]
    assert loaded.think_ns.tolist()[-2:] == [-1, 600_000_000] and loaded.tool_chars.tolist()[-1] == 321
    assert loaded.parent_id[-1] == loaded.chat_id[-2] == 0x1111222233334444
    assert loaded.turn.tolist()[-2:] == [0, 1] and loaded.session[-1] == loaded.session[-2]


def test_an_agent_graph_round_trips_with_its_joins_and_spawns(tmp_path: Path) -> None:
    """A root, three branches of it, a spawned sub-agent and a join of all of them: every edge back,
    in arrival order, whatever order the writer saw (responses end out of order)."""
    root = RequestShape(offset_ns=0, session=9, chat_id=100, e2e_ns=5)
    branches = [
        RequestShape(offset_ns=10 + i, session=9, turn=1, parent_id=100, chat_id=200 + i, think_ns=i)
        for i in range(3)
    ]
    spawned = RequestShape(offset_ns=13, session=9, turn=1, parent_id=100, chat_id=300, spawned=True)
    join = RequestShape(
        offset_ns=50, session=9, turn=2, parent_id=100, chat_id=400, join_ids=(200, 201, 202, 300), think_ns=7
    )
    written = [join, *reversed(branches), spawned, root]
    loaded = trace.load(write(tmp_path / "graph.rpt", written))
    assert shapes_of(tmp_path / "graph.rpt") == sorted(written, key=lambda s: s.offset_ns)
    assert loaded.joins_of(len(loaded) - 1).tolist() == [200, 201, 202, 300]
    assert [len(loaded.joins_of(i)) for i in range(len(loaded))] == [0, 0, 0, 0, 0, 4]
    assert loaded.spawned.tolist() == [False, False, False, False, True, False]


def test_the_shape_helper_reads_what_the_writer_wrote(tmp_path: Path) -> None:
    """shapes_of (the tests' whole-record view of trace.load) against a trace written by write_trace."""
    written = [
        RequestShape(offset_ns=i, model="m", prefix_hashes=(i,), chunk_gaps_us=(i, i)) for i in range(4)
    ]
    clock = FakeClock()
    trace.write_trace(
        tmp_path / "t.rpt",
        TraceHeader(start_wall_ns=0),
        written,
        mono_ns=clock.mono_ns,
        wall_ns=clock.wall_ns,
    )
    assert shapes_of(tmp_path / "t.rpt") == written


def test_a_load_can_digest_the_files_it_reads_in_path_order(tmp_path: Path) -> None:
    """The replayer names its trace by this digest: the sha256 of the files' bytes, in name order."""
    write(tmp_path / "b.rpt", [RequestShape(offset_ns=0)], start_wall_ns=5)
    write(tmp_path / "a.rpt", [RequestShape(offset_ns=0)])
    expected = hashlib.sha256((tmp_path / "a.rpt").read_bytes() + (tmp_path / "b.rpt").read_bytes())
    cols = trace.load([tmp_path], digest=True)
    assert cols.report.content.hexdigest() == expected.hexdigest()
    assert cols.report.paths == [str(tmp_path / "a.rpt"), str(tmp_path / "b.rpt")]
    assert trace.load([tmp_path]).report.content is None  # not asked: no hashing


WINDOWS = {
    "all": lambda n, rng: np.arange(n),
    "none": lambda n, rng: np.zeros(0, np.int64),
    "first row": lambda n, rng: np.array([0]),
    "last row": lambda n, rng: np.array([n - 1]),
    "head": lambda n, rng: np.arange(n // 3),
    "tail": lambda n, rng: np.arange(n - n // 3, n),
    "middle": lambda n, rng: np.arange(n // 4, n - n // 4),
    "sparse": lambda n, rng: np.flatnonzero(rng.random(n) < 0.4),
    "shuffled, repeated": lambda n, rng: rng.integers(0, n, 2 * n),
}


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("seed", range(4))
def test_ragged_rows_are_the_rows_one_by_one_laid_end_to_end(window: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 4, 60) * (rng.random(60) < 0.7)  # many rows hold nothing
    index = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = rng.integers(0, 2**64, int(index[-1]), dtype=np.uint64)
    rows = WINDOWS[window](60, rng)
    taken, taken_index = trace.ragged_rows(flat, index, rows)
    one_by_one = [flat[index[r] : index[r + 1]] for r in rows]
    assert taken.dtype == flat.dtype and taken_index.dtype == np.int64
    assert np.array_equal(taken, np.concatenate([np.zeros(0, np.uint64), *one_by_one]))
    assert np.diff(taken_index).tolist() == [len(row) for row in one_by_one] and taken_index[0] == 0
