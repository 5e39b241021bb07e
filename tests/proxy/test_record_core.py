"""Recording's work (proxy/recording/core.py), driven in-process: writes, survives failures and resumes,
rotates and retains; what it counts reaches the proxy's metrics through a `Tally` (recording/tally.py)."""

from __future__ import annotations

import errno
import shutil
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from replayproxy.clock import Anchor, now_ns
from replayproxy.proxy.metrics import ProxyMetrics
from replayproxy.proxy.observe import Capture
from replayproxy.proxy.prompt import PromptHasher
from replayproxy.proxy.recording.core import TraceRecorder, trace_files
from replayproxy.proxy.recording.tally import Tally, apply
from replayproxy.shape import key_fingerprint
from replayproxy.trace import ReadReport, TraceWriter, read_trace_files
from replayproxy.trace.frames import FrameWriter
from tests.proxy.helpers import add_piece, settings
from tests.trace.helpers import shapes_of

KEY = b"r" * 32


class Core:
    """A TraceRecorder whose reports are applied to a registry after each step, as the proxy does."""

    def __init__(self, tmp_path: Path, **overrides: Any) -> None:
        self.metrics = ProxyMetrics()
        self.settings = settings("http://user:pw@127.0.0.1:9/base", tmp_path / "traces", **overrides)
        self.tally = Tally()
        self.core = TraceRecorder(self.settings, PromptHasher(KEY), Anchor.take(), self.tally)
        self.core.start()
        self._apply()

    def record(self, *captures: Capture) -> None:
        self.core.record(captures)
        self._apply()

    def idle(self, rotate: bool = False) -> None:
        self.core.idle(rotate)
        self._apply()

    def close(self) -> None:
        self.core.close()
        self._apply()

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def _apply(self) -> None:
        apply(self.tally.take(), self.metrics)


def cap(i: int = 0) -> Capture:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"question {i}"}]})
    answer = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 10 + i, "completion_tokens": i}})
    c = Capture(
        arrival_ns=now_ns(),
        endpoint="chat",
        method="POST",
        path="/v1/chat/completions",
        request_body=[body],
        request_bytes=len(body),
        status=200,
    )
    add_piece(c, answer, now_ns())
    c.end_ns = now_ns()
    return c


def test_records_are_written_with_header_and_footer(tmp_path: Path) -> None:
    core = Core(tmp_path)
    core.record(*(cap(i) for i in range(5)))
    core.close()
    report = ReadReport()
    [(header, table)] = read_trace_files([tmp_path / "traces"], report)
    assert table.n == 5 and report.footers == 1
    assert (header.block_unit, header.block_size, header.source) == ("char", 64, "proxy")
    assert header.key_fingerprint == key_fingerprint(KEY)
    assert header.upstream == "http://127.0.0.1:9/base"  # credentials never reach the trace
    assert sorted(s.input_tokens for s in shapes_of(tmp_path / "traces")) == [10, 11, 12, 13, 14]
    assert core.sample("replayproxy_records_written_total") == 5
    [path] = (tmp_path / "traces").glob("*.rpt")
    assert core.sample("replayproxy_trace_bytes_written_total") == path.stat().st_size
    assert core.sample("replayproxy_input_tokens_total", endpoint="chat") == 60
    assert core.sample("replayproxy_ttft_seconds_count", endpoint="chat") == 5
    assert core.sample("replayproxy_trace_files") == 1


def test_unwritable_directory_drops_counts_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "traces"
    blocker.write_text("a file where the directory should be")
    core = Core(tmp_path, retry_s=0.2)
    core.record(*(cap(i) for i in range(3)))
    assert core.sample("replayproxy_records_dropped_total", reason="writer_error") == 3
    assert core.tally.failing.startswith("io: ")
    core.record(cap(4))  # within retry_s: dropped without another try
    assert core.sample("replayproxy_recorder_errors_total", kind="io") == 1
    assert core.sample("replayproxy_records_dropped_total", reason="writer_error") == 4
    assert sum("trace writing failed" in r.message for r in caplog.records) == 1
    blocker.unlink()
    time.sleep(0.3)
    core.record(cap(7))
    core.close()
    assert [s.input_tokens for s in shapes_of(blocker)] == [17]
    assert core.tally.failing == ""


def test_a_writer_crash_is_survived(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = TraceWriter.write_many
    calls: list[int] = []

    def flaky(self: TraceWriter, shapes: Any) -> None:
        calls.append(len(shapes))
        if len(calls) == 2:  # the second batch fails, and the first one's unflushed record with it
            raise RuntimeError("bug")
        original(self, shapes)

    monkeypatch.setattr(TraceWriter, "write_many", flaky)
    core = Core(tmp_path, retry_s=0.05)
    core.record(cap(0))
    core.record(cap(1))
    assert core.sample("replayproxy_recorder_errors_total", kind="crash") == 1
    time.sleep(0.1)
    core.record(cap(2))
    core.close()
    assert core.sample("replayproxy_records_dropped_total", reason="writer_error") == 2  # 0 and 1
    assert [s.input_tokens for s in shapes_of(tmp_path / "traces")] == [12]


def test_a_bad_capture_is_a_shape_error(tmp_path: Path) -> None:
    core = Core(tmp_path)
    broken = cap()
    broken.event_stream = True
    broken.piece_ns.append(1)  # more times than pieces: extraction fails
    core.record(broken, cap(1))
    core.close()
    assert core.sample("replayproxy_records_dropped_total", reason="shape_error") == 1
    assert core.sample("replayproxy_records_written_total") == 1


def test_rotate_now_and_retention_by_count(tmp_path: Path) -> None:
    core = Core(tmp_path, retain_files=2)
    for i in range(4):
        core.record(cap(i))
        core.idle(rotate=True)
        time.sleep(0.01)
    core.close()
    files = trace_files(core.settings)
    assert len(files) == 2 and core.sample("replayproxy_trace_files") == 2
    assert sorted(s.input_tokens for s in shapes_of(files)) == [12, 13]


def test_a_deleted_trace_directory_is_noticed_recreated_and_its_records_counted_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    core = Core(tmp_path, flush_interval_s=0.05)
    core.record(*(cap(i) for i in range(5)))
    time.sleep(0.06)
    core.idle()
    assert core.sample("replayproxy_records_written_total") == 5
    shutil.rmtree(tmp_path / "traces")  # the open file goes with it
    time.sleep(0.06)
    core.idle()  # the next flush notices
    assert (tmp_path / "traces").is_dir()
    assert core.sample("replayproxy_records_lost_total", reason="file_deleted") == 5
    assert any("was deleted while open: 5 records lost" in r.message for r in caplog.records)
    core.record(*(cap(10 + i) for i in range(3)))
    core.close()
    assert sorted(s.input_tokens for s in shapes_of(tmp_path / "traces")) == [20, 21, 22]


def test_a_full_disk_leaves_no_empty_or_header_only_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = FrameWriter.write_frame
    failures = {"left": 6}

    def full(self: FrameWriter, parts: Any, records: int) -> None:
        if failures["left"] > 0:
            failures["left"] -= 1
            if failures["left"] % 2 and records == 0:  # sometimes the header fits, the batch does not
                original(self, parts, records)
                return
            raise OSError(errno.ENOSPC, "No space left on device")
        original(self, parts, records)

    monkeypatch.setattr(FrameWriter, "write_frame", full)
    core = Core(tmp_path, retry_s=0.05, flush_interval_s=0.02)
    deadline = now_ns() + 10**10
    while failures["left"] and now_ns() < deadline:  # each retry meets the full disk again
        core.record(cap(0))
        time.sleep(0.03)
        core.idle()
    assert not failures["left"]
    time.sleep(0.1)  # past retry_s: the disk has room again
    core.record(cap(9))
    core.close()
    assert core.sample("replayproxy_recorder_errors_total", kind="disk_full") >= 3
    files = list((tmp_path / "traces").glob("*.rpt"))
    report = ReadReport()
    tables = read_trace_files(files, report)
    assert all(table.n > 0 for _, table in tables) and report.skipped_files == 0
    assert 9 in [s.input_tokens - 10 for s in shapes_of(files)]


def test_a_tally_crosses_the_pipe_whole() -> None:
    tally = Tally(received=3, written=2, trace_bytes=100, failing="io: OSError", trace_files=4)
    tally.count(tally.dropped, "shape_error")
    tally.count(tally.clamped, "max_tokens", 2)
    tally.endpoint("chat").ttft.observe(0.2)
    tally.endpoint("chat").input_tokens = 7
    tally.logs.append((40, "a line"))
    record = orjson.dumps(tally.to_record())
    again = Tally.from_record(orjson.loads(record))
    assert orjson.dumps(again.to_record()) == record and again.settled == 3
    assert again.figures["chat"].ttft.counts == tally.figures["chat"].ttft.counts
    taken = tally.take()
    assert orjson.dumps(taken.to_record()) == record
    assert not tally.changed() and tally.failing == "io: OSError"  # the state stays, the counts go
