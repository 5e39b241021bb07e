"""Writing traces (replayproxy/trace/writer.py): the recorder's writer rotates by size and age,
flushes on an interval, survives an abandoned or deleted file; whole-trace writers for synth and
import write what the recorder's writer writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from replayproxy import trace
from replayproxy.shape import FIELD_KINDS, RequestShape
from replayproxy.trace import TraceHeader, TraceWriter
from replayproxy.trace.frames import iter_frame_payloads
from tests.trace.helpers import FakeClock, exact, shapes_of


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
    loaded = trace.load(first)
    assert loaded.offset_ns.tolist() == [0, 1, 2, 3] and loaded.report.footers == 0
    assert trace.load(writer.files[1]).offset_ns.tolist() == [10]


def test_a_file_deleted_while_open_is_counted_lost_and_writing_goes_on(tmp_path: Path) -> None:
    clock = FakeClock()
    directory = tmp_path / "traces"
    writer = TraceWriter(
        TraceHeader(start_wall_ns=0), directory=directory, mono_ns=clock.mono_ns, wall_ns=clock.wall_ns
    )
    writer.write_many([RequestShape(offset_ns=i) for i in range(3)])
    writer.flush()
    deleted = writer.current_path
    assert deleted is not None
    deleted.unlink()
    directory.rmdir()
    writer.write(RequestShape(offset_ns=7))
    writer.flush()  # notices the deletion: the directory comes back with a new file
    writer.close()
    assert writer.records_lost == 3 and writer.lost_files == [deleted]
    assert trace.load(directory).offset_ns.tolist() == [7]


def test_whole_trace_writers_agree_with_the_recorders_writer(tmp_path: Path) -> None:
    shapes = [
        RequestShape(
            offset_ns=i, model="m", input_tokens=i, prefix_hashes=(i, i + 1), chunk_gaps_us=(i,) * (i % 3)
        )
        for i in range(5)
    ]
    clock = FakeClock()
    header = TraceHeader(start_wall_ns=0)
    assert (
        trace.write_trace(tmp_path / "a.rpt", header, shapes, mono_ns=clock.mono_ns, wall_ns=clock.wall_ns)
        == 5
    )
    columns = {
        "offset_ns": np.arange(5),
        "model": "m",  # one value for every row
        "input_tokens": np.arange(5),
        "prefix_hashes": (np.array([v for i in range(5) for v in (i, i + 1)], np.uint64), np.full(5, 2)),
        "chunk_gaps_us": (np.array([i for i in range(5) for _ in range(i % 3)], np.uint32), np.arange(5) % 3),
    }
    assert (
        trace.write_columns(tmp_path / "b.rpt", header, columns, 5, wall_ns=clock.wall_ns, frame_records=2)
        == 5
    )
    assert [exact(s) for s in shapes_of(tmp_path / "a.rpt")] == [exact(s) for s in shapes]
    assert [exact(s) for s in shapes_of(tmp_path / "b.rpt")] == [exact(s) for s in shapes]
    assert trace.load(tmp_path / "b.rpt").report.frames == 1 + 3 + 1


def test_values_that_do_not_fit_are_fitted_and_counted_not_lost(tmp_path: Path) -> None:
    counted: dict[str, int] = {}
    clock = FakeClock()
    with TraceWriter(
        TraceHeader(start_wall_ns=0),
        path=tmp_path / "t.rpt",
        mono_ns=clock.mono_ns,
        wall_ns=clock.wall_ns,
        count_unfit=lambda name, n: counted.__setitem__(name, counted.get(name, 0) + n),
    ) as writer:
        writer.write(RequestShape(offset_ns=0, input_tokens=2**70))
        writer.write(RequestShape(offset_ns=1, input_tokens=3, model=5))  # type: ignore[arg-type]
    loaded = trace.load(tmp_path / "t.rpt")
    assert loaded.input_tokens.tolist() == [2**63 - 1, 3] and loaded.model.tolist() == ["", ""]
    assert counted == {"input_tokens": 1, "model": 1}


def test_graph_links_hold_only_numbers_so_text_put_there_never_reaches_a_file(tmp_path: Path) -> None:
    """join_ids and spawned are keyed hashes and a flag: text a buggy producer put there is dropped
    (counted), never stored, and the hashes themselves come back exactly."""
    counted: dict[str, int] = {}
    clock = FakeClock()
    path = tmp_path / "t.rpt"
    secret = "secret sub-agent answer"
    with TraceWriter(
        TraceHeader(start_wall_ns=0),
        path=path,
        mono_ns=clock.mono_ns,
        wall_ns=clock.wall_ns,
        count_unfit=lambda name, n: counted.__setitem__(name, counted.get(name, 0) + n),
    ) as writer:
        writer.write(RequestShape(offset_ns=0, join_ids=(2**64 - 1, 5), spawned=True))
        writer.write(RequestShape(offset_ns=1, join_ids=(secret,)))  # type: ignore[arg-type]
    stored = b"".join(bytes(p) for p in iter_frame_payloads(path.read_bytes(), str(path), trace.ReadReport()))
    assert secret.encode()[:8] not in stored and counted == {"join_ids": 1}
    loaded = trace.load(path)
    assert loaded.joins_of(0).tolist() == [2**64 - 1, 5] and len(loaded.joins_of(1)) == 0
    assert loaded.spawned.tolist() == [True, False]
    assert {FIELD_KINDS[name] for name in ("join_ids", "spawned")} == {"ragged:u8", "b1"}
