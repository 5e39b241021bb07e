"""Trace files: round trips, damage recovery, rotation, merging and version checks (replayproxy/trace.py)."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayproxy import trace
from replayproxy.shape import FIELD_KINDS, FIELDS, RequestShape
from replayproxy.trace import TraceFormatError, TraceHeader, TraceWriter

I64 = st.integers(-(2**63), 2**63 - 1)
U64 = st.integers(0, 2**64 - 1)
sampling_values = st.one_of(st.booleans(), I64, st.floats(allow_nan=True, allow_infinity=True))
shapes = st.builds(
    RequestShape,
    offset_ns=I64,
    endpoint=st.sampled_from(["chat", "completions", "embeddings", "other"]) | st.text(max_size=5),
    model=st.text(max_size=10),
    stream=st.booleans(),
    input_tokens=I64,
    output_tokens=I64,
    output_estimated=st.booleans(),
    max_tokens=I64,
    sampling=st.dictionaries(st.text(max_size=8), sampling_values, max_size=4),
    roles=st.text(alphabet="suatdfo", max_size=8),
    has_tools=st.booleans(),
    has_response_format=st.booleans(),
    prefix_hashes=st.lists(U64, max_size=6).map(tuple),
    prefix_units=I64,
    status=I64,
    error=st.sampled_from(["", "http_5xx", "timeout"]),
    ttft_ns=I64,
    e2e_ns=I64,
    chunk_gaps_us=st.lists(st.integers(0, 2**32 - 1), max_size=6).map(tuple),
    cached_tokens=I64,
    session=U64,
    turn=I64,
    method=st.sampled_from(["POST", "GET"]),
    request_bytes=I64,
    response_bytes=I64,
    think_ns=I64,
    chat_id=U64,
    parent_id=U64,
    tool_chars=I64,
    request_type=st.sampled_from(["", "text", "search"]),
)


class FakeClock:
    """Injected monotonic and wall clocks that only move when a test says so."""

    def __init__(self, wall_ns: int = 1_700_000_000 * 10**9) -> None:
        self.mono = 0
        self.wall = wall_ns

    def advance(self, seconds: float) -> None:
        self.mono += int(seconds * 1e9)
        self.wall += int(seconds * 1e9)

    def mono_ns(self) -> int:
        return self.mono

    def wall_ns(self) -> int:
        return self.wall


def exact(shape: RequestShape) -> list[tuple[str, str]]:
    """Field values compared by repr, so True vs 1, 1.0 vs 1 and NaN are told apart or matched."""
    return [(name, repr(getattr(shape, name))) for name in FIELDS]


def write(path: Path, shapes: list[RequestShape], start_wall_ns: int = 0, **options: Any) -> Path:
    clock = FakeClock()
    with TraceWriter(
        TraceHeader(start_wall_ns=start_wall_ns),
        path=path,
        mono_ns=clock.mono_ns,
        wall_ns=clock.wall_ns,
        **options,
    ) as writer:
        for shape in shapes:
            writer.write(shape)
    return path


def column_value(columns: trace.Columns, name: str, i: int) -> Any:
    if name == "prefix_hashes":
        return tuple(int(h) for h in columns.hashes_of(i))
    if name == "chunk_gaps_us":
        return tuple(
            int(g) for g in columns.chunk_gaps_us[columns.chunk_index[i] : columns.chunk_index[i + 1]]
        )
    value = getattr(columns, name)[i]
    return value.item() if isinstance(value, np.generic) else value


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(shapes, max_size=12), st.integers(1, 5))
def test_every_field_round_trips(tmp_path: Path, written: list[RequestShape], frame_records: int) -> None:
    path = write(tmp_path / "t.rpt", written, frame_records=frame_records)
    in_order = sorted(written, key=lambda s: s.offset_ns)
    read = list(trace.iter_shapes([path]))
    assert [exact(s) for s in read] == [exact(s) for s in in_order]
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
    assert columns.model.dtype == object and columns.message_count.tolist() == [0]
    with pytest.raises(AttributeError):
        _ = columns.no_such_field


# --------------------------------------------------------------------------- truncation and damage


def frame_bounds(data: bytes) -> list[tuple[int, int, int]]:
    """(start, end, records) of each frame, read with the documented index layout."""
    bounds, pos = [], 0
    while pos < len(data):
        magic, size, length, records = struct.unpack_from("<IIII", data, pos)
        assert (magic, size) == (0x184D2A5E, 8)
        bounds.append((pos, pos + 16 + length, records))
        pos += 16 + length
    return bounds


def test_truncation_at_every_byte_recovers_exactly_the_complete_frames(tmp_path: Path) -> None:
    written = [RequestShape(offset_ns=i, input_tokens=i, prefix_hashes=(i, i + 1)) for i in range(7)]
    data = write(tmp_path / "full.rpt", written, frame_records=2).read_bytes()
    bounds = frame_bounds(data)
    assert [records for _, _, records in bounds] == [0, 2, 2, 2, 1, 0]  # header, 4 batches, footer
    cut_path = tmp_path / "cut.rpt"
    for cut in range(len(data)):
        cut_path.write_bytes(data[:cut])
        complete = [b for b in bounds if b[1] <= cut]
        if not complete:  # the header frame itself is incomplete: not a readable trace
            with pytest.raises(TraceFormatError, match="empty file|no header record"):
                trace.load(cut_path)
            continue
        expected = sum(records for _, _, records in complete)
        columns = trace.load(cut_path)
        assert columns.input_tokens.tolist() == list(range(expected)), cut
        report = columns.report
        if cut in {end for _, end, _ in bounds}:
            assert report.warnings == [], cut
        else:
            assert len(report.warnings) == 1, cut
            warning = report.warnings[0]
            at = complete[-1][1]
            assert str(cut_path) in warning and f"offset {at}" in warning, warning
            assert "truncated" in warning
            if cut - at >= 16:  # the index was complete: the reader knows how many records were lost
                lost = bounds[len(complete)][2]
                assert report.lost_records == lost and f"{lost} records lost" in warning
        assert report.footers == (1 if cut == len(data) else 0)


def test_corrupt_middle_frame_is_skipped_and_reported(tmp_path: Path) -> None:
    written = [RequestShape(offset_ns=i, input_tokens=i) for i in range(6)]
    data = bytearray(write(tmp_path / "t.rpt", written, frame_records=2).read_bytes())
    start, end, records = frame_bounds(bytes(data))[2]  # the second batch: rows 2 and 3
    data[(start + 16 + end) // 2] ^= 0xFF
    (tmp_path / "t.rpt").write_bytes(bytes(data))
    columns = trace.load(tmp_path / "t.rpt")
    assert columns.input_tokens.tolist() == [0, 1, 4, 5]
    assert columns.report.skipped_frames == 1 and columns.report.lost_records == records == 2
    assert any(
        f"corrupt frame at offset {start}" in w and "2 records lost" in w for w in columns.report.warnings
    )
    assert columns.report.footers == 1  # frames after the damage still load


def test_damaged_frame_index_resumes_at_the_next_frame(tmp_path: Path) -> None:
    written = [RequestShape(offset_ns=i, input_tokens=i) for i in range(6)]
    data = bytearray(write(tmp_path / "t.rpt", written, frame_records=2).read_bytes())
    start, _, _ = frame_bounds(bytes(data))[1]
    struct.pack_into("<I", data, start + 8, 10**9)  # a compressed length far past the end
    (tmp_path / "t.rpt").write_bytes(bytes(data))
    columns = trace.load(tmp_path / "t.rpt")
    assert columns.input_tokens.tolist() == [2, 3, 4, 5]
    assert any(f"damaged frame index at offset {start}" in w for w in columns.report.warnings)


def test_garbage_between_frames_is_skipped(tmp_path: Path) -> None:
    written = [RequestShape(offset_ns=i, input_tokens=i) for i in range(4)]
    data = write(tmp_path / "t.rpt", written, frame_records=2).read_bytes()
    _, end, _ = frame_bounds(data)[1]
    (tmp_path / "t.rpt").write_bytes(data[:end] + b"\x00junk" * 7 + data[end:])
    columns = trace.load(tmp_path / "t.rpt")
    assert columns.input_tokens.tolist() == [0, 1, 2, 3]
    assert columns.report.warnings == [f"{tmp_path / 't.rpt'}: 35 unreadable bytes at offset {end} skipped"]


def test_undecodable_payload_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path / "t.rpt", [RequestShape(offset_ns=1, input_tokens=7)])
    bad = zstandard.ZstdCompressor(write_checksum=True).compress(b"\xc1\xc1")  # 0xc1 is never valid msgpack
    path.write_bytes(path.read_bytes() + struct.pack("<IIII", 0x184D2A5E, 8, len(bad), 3) + bad)
    columns = trace.load(path)
    assert columns.input_tokens.tolist() == [7]
    assert any("does not decode" in w for w in columns.report.warnings)


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


def _as_bytes(value: object) -> bytes:
    """encode_column's blobs (arrays, pieces) as the plain bytes msgpack writes."""
    if isinstance(value, trace.Pieces):
        return b"".join(value.items)
    if isinstance(value, np.ndarray):
        return value.tobytes()
    raise TypeError(type(value))


def frames_with_header(header: dict[str, Any], batches: list[dict[str, Any]], sized: bool = True) -> bytes:
    compressor = zstandard.ZstdCompressor(write_checksum=True, write_content_size=sized)
    out = b""
    for record in [header, *batches]:
        frame = compressor.compress(msgpack.packb(record, use_bin_type=True, default=_as_bytes))
        out += struct.pack("<IIII", 0x184D2A5E, 8, len(frame), record.get("n", 0)) + frame
    return out


def test_frames_that_do_not_declare_their_size_still_load(tmp_path: Path) -> None:
    """Other writers may stream frames without a content size; the reader then decompresses them
    the slow way instead of into its reused buffer."""
    header = TraceHeader(start_wall_ns=0).to_record()
    rows = [
        RequestShape(offset_ns=i, input_tokens=i, prefix_hashes=(i, 2**64 - 1)).to_record() for i in range(3)
    ]
    columns = [
        trace.encode_column(FIELD_KINDS[f], col)
        for f, col in zip(FIELDS, zip(*rows, strict=True), strict=True)
    ]
    path = tmp_path / "unsized.rpt"
    path.write_bytes(frames_with_header(header, [{"type": "batch", "n": 3, "columns": columns}], sized=False))
    loaded = trace.load(path)
    assert loaded.input_tokens.tolist() == [0, 1, 2] and loaded.hashes_of(2).tolist() == [2, 2**64 - 1]
    assert loaded.report.warnings == []


def test_newer_major_version_is_refused_clearly(tmp_path: Path) -> None:
    header = TraceHeader(start_wall_ns=0).to_record() | {"version": trace.FORMAT_VERSION + 1}
    path = tmp_path / "new.rpt"
    path.write_bytes(frames_with_header(header, []))
    with pytest.raises(TraceFormatError, match=r"format version 3 is newer than this reader \(2\); upgrade"):
        trace.load(path)


def test_unknown_fields_from_a_newer_minor_writer_are_ignored(tmp_path: Path) -> None:
    header = TraceHeader(start_wall_ns=0).to_record()
    header["fields"] = [*header["fields"], "future_field"]
    header["kinds"]["future_field"] = "i8"
    rows = [(*RequestShape(offset_ns=i, input_tokens=10 + i).to_record(), 99) for i in range(3)]
    columns = [
        trace.encode_column(header["kinds"][f], col)
        for f, col in zip(header["fields"], zip(*rows, strict=True), strict=True)
    ]
    path = tmp_path / "newer.rpt"
    path.write_bytes(frames_with_header(header, [{"type": "batch", "n": 3, "columns": columns}]))
    assert trace.load(path).input_tokens.tolist() == [10, 11, 12]
    assert [s.input_tokens for s in trace.iter_shapes([path])] == [10, 11, 12]


def test_files_with_fewer_fields_load_with_defaults(tmp_path: Path) -> None:
    kept = ["offset_ns", "input_tokens", "prefix_hashes"]
    header = TraceHeader(start_wall_ns=0, fields=tuple(kept)).to_record()
    rows = [(i, 5 * i, struct.pack("<Q", i)) for i in range(3)]
    columns = [
        trace.encode_column(FIELD_KINDS[f], col) for f, col in zip(kept, zip(*rows, strict=True), strict=True)
    ]
    path = tmp_path / "old.rpt"
    path.write_bytes(frames_with_header(header, [{"type": "batch", "n": 3, "columns": columns}]))
    loaded = trace.load(path)
    assert loaded.input_tokens.tolist() == [0, 5, 10] and loaded.output_tokens.tolist() == [-1, -1, -1]
    assert loaded.model.tolist() == ["", "", ""] and loaded.stream.tolist() == [True] * 3
    assert loaded.hashes_of(2).tolist() == [2] and len(loaded.chunk_gaps_us) == 0
    assert [s.offset_ns for s in trace.iter_shapes([path])] == [0, 1, 2]


def test_malformed_batch_is_skipped(tmp_path: Path) -> None:
    header = TraceHeader(start_wall_ns=0).to_record()
    good = [RequestShape(offset_ns=i).to_record() for i in range(2)]
    columns = [
        trace.encode_column(FIELD_KINDS[f], col)
        for f, col in zip(FIELDS, zip(*good, strict=True), strict=True)
    ]
    short = list(columns)
    short[0] = short[0].tobytes()[:8]  # offset_ns column holds one row, the batch says two
    path = tmp_path / "bad-batch.rpt"
    batches = [{"type": "batch", "n": 2, "columns": short}, {"type": "batch", "n": 2, "columns": columns}]
    path.write_bytes(frames_with_header(header, batches))
    loaded = trace.load(path)
    assert loaded.offset_ns.tolist() == [0, 1]
    assert any("malformed batch of 2 records" in w for w in loaded.report.warnings)


# --------------------------------------------------------------------------- rotation and merging


def test_rotation_by_size(tmp_path: Path) -> None:
    clock = FakeClock()
    header = TraceHeader(start_wall_ns=clock.wall)
    writer = TraceWriter(
        header,
        directory=tmp_path,
        prefix="rec",
        mono_ns=clock.mono_ns,
        wall_ns=clock.wall_ns,
        frame_records=10,
        rotate_bytes=2000,
    )
    rng = np.random.default_rng(1)
    for i in range(200):
        writer.write(
            RequestShape(offset_ns=i * 1000, input_tokens=i, prefix_hashes=tuple(rng.integers(0, 2**63, 8)))
        )
    writer.close()
    assert len(writer.files) > 3
    assert writer.files == sorted(tmp_path.glob("rec-*.rpt"))
    for path in writer.files:
        assert path.name.startswith("rec-20231114T221320Z-")
        assert path.stat().st_size < 2000 + 1500  # rotation happens at the first frame past the limit
        assert trace.load(path).report.footers == 1
    assert writer.records_written == 200
    assert writer.bytes_written == sum(p.stat().st_size for p in writer.files)
    merged = trace.load(tmp_path)
    assert merged.input_tokens.tolist() == list(range(200))
    assert merged.offset_ns.tolist() == [i * 1000 for i in range(200)]
    assert {h.start_wall_ns for h in merged.headers} == {header.start_wall_ns}


def test_rotation_by_age_and_flush_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    writer = TraceWriter(
        TraceHeader(start_wall_ns=clock.wall),
        directory=tmp_path,
        mono_ns=clock.mono_ns,
        wall_ns=clock.wall_ns,
        flush_interval_s=1.0,
        rotate_seconds=60,
    )
    writer.write(RequestShape(offset_ns=0))
    assert writer.current_path is not None and writer.current_path.stat().st_size > 0
    size = writer.current_path.stat().st_size
    clock.advance(0.5)
    writer.poll()
    assert writer.current_path.stat().st_size == size  # not yet: the interval has not passed
    clock.advance(0.6)
    writer.poll()
    assert writer.current_path.stat().st_size > size  # the pending record reached the disk
    assert trace.load(writer.current_path).offset_ns.tolist() == [0]
    first = writer.current_path
    clock.advance(59)
    writer.poll()
    assert writer.current_path is None and writer.files == [first]  # closed by age, even when idle
    writer.write(RequestShape(offset_ns=61 * 10**9))
    clock.advance(1)
    writer.write(RequestShape(offset_ns=62 * 10**9))
    writer.close()
    assert len(writer.files) == 2 and writer.files[1].name.endswith("-0002.rpt")
    assert "T221420Z" in writer.files[1].name  # named by the wall clock at opening
    assert trace.load(tmp_path).offset_ns.tolist() == [0, 61 * 10**9, 62 * 10**9]


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
    shapes_read = list(trace.iter_shapes([tmp_path]))
    assert [s.offset_ns for s in shapes_read] == loaded.offset_ns.tolist()
    assert [s.input_tokens for s in shapes_read] == loaded.input_tokens.tolist()


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


def test_header_round_trips_and_records_when_the_file_was_created(tmp_path: Path) -> None:
    header = TraceHeader(
        start_wall_ns=123,
        source="synth",
        block_size=32,
        block_unit="char",
        key_fingerprint="ab" * 8,
        upstream="http://u",
        tokenizer="tok",
        recorder="replayproxy 0",
        extra={"note": 1},
    )
    clock = FakeClock()
    trace.write_trace(tmp_path / "t.rpt", header, [], mono_ns=clock.mono_ns, wall_ns=clock.wall_ns)
    (read,) = trace.load(tmp_path / "t.rpt").headers
    assert read == replace(header, created_wall_ns=clock.wall)


# --------------------------------------------------------------------------- the golden file

GOLDEN = Path(__file__).parent / "data" / "trace-v1-golden.rpt"
GOLDEN_V2 = Path(__file__).parent / "data" / "trace-v2-golden.rpt"


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
    assert [exact(s) for s in trace.iter_shapes([GOLDEN])] == [exact(s) for s in expected]
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
    assert [exact(s) for s in trace.iter_shapes([GOLDEN_V2])] == [exact(s) for s in golden_shapes(2)]
    assert loaded.think_ns.tolist()[-2:] == [-1, 600_000_000] and loaded.tool_chars.tolist()[-1] == 321
    assert loaded.parent_id[-1] == loaded.chat_id[-2] == 0x1111222233334444
    assert loaded.turn.tolist()[-2:] == [0, 1] and loaded.session[-1] == loaded.session[-2]


def test_equal_looking_sampling_values_keep_their_types(tmp_path: Path) -> None:
    samplings = [{"n": 1}, {"n": True}, {"n": 1.0}, {"t": 0.0}, {"t": -0.0}, {}]
    written = [RequestShape(offset_ns=i, sampling=s) for i, s in enumerate(samplings)]
    path = write(tmp_path / "t.rpt", written)
    assert [repr(s.sampling) for s in trace.iter_shapes([path])] == [repr(s) for s in samplings]
    assert [repr(s) for s in trace.load(path).sampling] == [repr(s) for s in samplings]


def test_an_abandoned_file_keeps_its_complete_frames_and_writing_goes_on(tmp_path: Path) -> None:
    clock = iter(range(0, 10**12, 1000))
    writer = TraceWriter(
        TraceHeader(start_wall_ns=0),
        directory=tmp_path,
        mono_ns=lambda: next(clock),
        wall_ns=lambda: 1_700_000_000 * 10**9,
        frame_records=2,
    )
    for i in range(5):  # two full frames on disk, one record buffered
        writer.write(RequestShape(offset_ns=i))
    first = writer.current_path
    writer.abandon()
    writer.write(RequestShape(offset_ns=10))
    writer.close()
    assert first is not None and writer.files[0] == first and len(writer.files) == 2
    report = trace.ReadReport()
    shapes = list(trace.iter_shapes([first], report))
    assert [s.offset_ns for s in shapes] == [0, 1, 2, 3] and report.footers == 0
    assert [s.offset_ns for s in trace.iter_shapes([writer.files[1]])] == [10]


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
    writer_shapes = [exact(s) for s in sparse + dense]
    assert [exact(s) for s in trace.iter_shapes([path])] == writer_shapes
