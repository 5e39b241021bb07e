"""Frames (replayproxy/trace/frames.py): a truncated, corrupt or padded file gives back every complete
frame before and after the damage, and says what it skipped."""

from __future__ import annotations

import io
import mmap
import struct
from pathlib import Path

import numpy as np
import pytest
import zstandard

from replayproxy import trace
from replayproxy.shape import RequestShape
from replayproxy.trace import ReadReport, TraceFormatError, TraceHeader, frames, write_columns
from replayproxy.trace.frames import (
    PLAUSIBLE_RATIO,
    FrameWriter,
    frame_totals,
    iter_frame_payloads,
    plausible_size,
)
from tests.trace.helpers import frame_bounds, write


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


def test_frames_that_do_not_declare_their_size_still_load(tmp_path: Path) -> None:
    """Other writers may stream frames without a content size; the reader then decompresses them
    the slow way instead of into its reused buffer."""
    written = [RequestShape(offset_ns=i, input_tokens=i, prefix_hashes=(i, 2**64 - 1)) for i in range(3)]
    data = write(tmp_path / "sized.rpt", written).read_bytes()
    unsized = zstandard.ZstdCompressor(write_checksum=True, write_content_size=False)
    out = b""
    for start, end, records in frame_bounds(data):  # the same records, re-framed without sizes
        payload = zstandard.ZstdDecompressor().decompressobj().decompress(data[start + 16 : end])
        frame = unsized.compress(payload)
        assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
        out += struct.pack("<IIII", 0x184D2A5E, 8, len(frame), records) + frame
    path = tmp_path / "unsized.rpt"
    path.write_bytes(out)
    loaded = trace.load(path)
    assert loaded.input_tokens.tolist() == [0, 1, 2] and loaded.hashes_of(2).tolist() == [2, 2**64 - 1]
    assert loaded.report.warnings == [] and loaded.report.footers == 1


def test_frame_writer_and_reader_agree_on_payloads_records_and_sizes() -> None:
    stream = io.BytesIO()
    frames = FrameWriter(stream, level=3)
    frames.write_frame([b"first", b" record"], 1)
    frames.write_frame([b"second" * 100], 2)
    data = stream.getvalue()
    assert frames.bytes_written == len(data)
    assert [records for _, _, records in frame_bounds(data)] == [1, 2]
    report = ReadReport()
    read = [
        bytes(payload) for payload in iter_frame_payloads(data, "mem", report)
    ]  # copied: a view is reused
    assert read == [b"first record", b"second" * 100]
    assert report.frames == 2 and report.warnings == []
    assert frame_totals(data) == (3, len(b"first record") + 600)  # read from the indexes alone


def test_a_declared_size_is_believed_only_up_to_a_plausible_ratio() -> None:
    assert plausible_size(1000, 100) == 1000
    assert plausible_size(10**12, 100) == PLAUSIBLE_RATIO * 100 + 4096  # a lying header cannot size memory
    assert plausible_size(-1, 100) == 0


@pytest.mark.parametrize("content", [b"", b"not ours at all"])
def test_a_file_that_does_not_start_with_a_frame_index_is_refused(content: bytes) -> None:
    with pytest.raises(TraceFormatError, match="not a replayproxy file"):
        list(iter_frame_payloads(content, "x.rpt", ReadReport()))


def test_a_mapped_trace_read_while_its_pages_are_released_loads_the_same_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large files are memory-mapped and each frame's pages dropped once read: nothing read is lost."""
    rows = 200_000
    rng = np.random.default_rng(5)
    columns = {
        "offset_ns": np.cumsum(rng.integers(1, 2_000_000, rows)),
        "input_tokens": rng.integers(1, 5000, rows),
        "prefix_hashes": (rng.integers(0, 2**64, 3 * rows, dtype=np.uint64), np.full(rows, 3)),
    }
    header = TraceHeader(start_wall_ns=0, source="test", block_size=16, block_unit="token")
    path = tmp_path / "big.rpt"
    write_columns(path, header, columns, rows, wall_ns=lambda: 0)
    assert path.stat().st_size > 4 << 20  # mapped, and spans many pages and frames
    monkeypatch.setattr(frames, "RELEASE_BYTES", 1 << 40)  # never released
    kept = trace.load(path)
    monkeypatch.setattr(frames, "RELEASE_BYTES", mmap.PAGESIZE)  # released after every frame
    released = trace.load(path)
    assert kept.report.frames > 3
    assert np.array_equal(released.prefix_hashes, columns["prefix_hashes"][0])
    assert np.array_equal(released.prefix_hashes, kept.prefix_hashes)
    assert np.array_equal(released.offset_ns, kept.offset_ns)
    assert np.array_equal(released.input_tokens, columns["input_tokens"])
