"""The recorder thread: writes, drops when full, survives failures and resumes, rotates and retains."""

from __future__ import annotations

import errno
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from replayproxy.clock import now_ns
from replayproxy.proxy.metrics import ProxyMetrics
from replayproxy.proxy.observe import Capture
from replayproxy.proxy.prompt import PromptHasher
from replayproxy.proxy.recorder import Recorder
from replayproxy.shape import key_fingerprint
from replayproxy.trace import FrameWriter, ReadReport, TraceWriter, read_trace_files
from tests.proxy.helpers import add_piece, settings
from tests.trace.helpers import shapes_of

KEY = b"r" * 32


def make(tmp_path: Path, **overrides: Any) -> tuple[Recorder, ProxyMetrics]:
    metrics = ProxyMetrics()
    s = settings("http://user:pw@127.0.0.1:9/base", tmp_path / "traces", **overrides)
    return Recorder(s, metrics, PromptHasher(KEY)), metrics


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


def sample(metrics: ProxyMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = now_ns() / 1e9 + timeout_s
    while not condition():
        assert now_ns() / 1e9 < deadline, "condition not reached"
        time.sleep(0.01)


def test_records_are_written_with_header_and_footer(tmp_path: Path) -> None:
    recorder, metrics = make(tmp_path)
    recorder.start()
    for i in range(5):
        recorder.finished(cap(i))
    recorder.close()
    report = ReadReport()
    [(header, table)] = read_trace_files([tmp_path / "traces"], report)
    assert table.n == 5 and report.footers == 1
    assert (header.block_unit, header.block_size, header.source) == ("char", 64, "proxy")
    assert header.key_fingerprint == key_fingerprint(KEY)
    assert header.upstream == "http://127.0.0.1:9/base"  # credentials never reach the trace
    assert sorted(s.input_tokens for s in shapes_of(tmp_path / "traces")) == [10, 11, 12, 13, 14]
    assert sample(metrics, "replayproxy_records_written_total") == 5
    assert (
        sample(metrics, "replayproxy_trace_bytes_written_total")
        == (tmp_path / "traces").glob("*.rpt").__next__().stat().st_size
    )
    assert sample(metrics, "replayproxy_input_tokens_total", endpoint="chat") == 60


def test_a_full_queue_drops_and_counts(tmp_path: Path) -> None:
    recorder, metrics = make(tmp_path, queue_records=3)
    for i in range(5):  # the thread is not started, so nothing drains the queue
        recorder.finished(cap(i))
    assert sample(metrics, "replayproxy_records_dropped_total", reason="queue_full") == 2
    small, small_metrics = make(tmp_path, queue_bytes=100)
    small.finished(cap())
    assert sample(small_metrics, "replayproxy_records_dropped_total", reason="queue_full") == 1


def test_sampling_and_endpoint_filters(tmp_path: Path) -> None:
    draws = iter([0.1, 0.9, 0.4])
    metrics = ProxyMetrics()
    s = settings(
        "http://127.0.0.1:9",
        tmp_path,
        sample_rate=0.5,
        include_endpoints=("chat", "other"),
        exclude_endpoints=("other",),
    )
    recorder = Recorder(s, metrics, PromptHasher(KEY), sample=lambda: next(draws))
    assert [recorder.wants("chat") for _ in range(3)] == [True, False, True]
    assert not recorder.wants("other") and not recorder.wants("embeddings")


def test_unwritable_directory_drops_counts_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "traces"
    blocker.write_text("a file where the directory should be")
    recorder, metrics = make(tmp_path, retry_s=0.2)
    recorder.start()
    for i in range(3):
        recorder.finished(cap(i))
    wait_for(lambda: sample(metrics, "replayproxy_records_dropped_total", reason="writer_error") >= 3)
    assert (
        sample(metrics, "replayproxy_recorder_errors_total", kind="io") == 1
    )  # then it waits before retrying
    assert sum("trace writing failed" in r.message for r in caplog.records) == 1
    blocker.unlink()
    time.sleep(0.3)
    recorder.finished(cap(7))
    recorder.close()
    assert [s.input_tokens for s in shapes_of(blocker)] == [17]


def test_a_writer_crash_is_survived(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = TraceWriter.write_many
    seen: list[Any] = []
    crashed: list[int] = []

    def flaky(self: TraceWriter, shapes: Any) -> None:
        seen.extend(shapes)
        if len(seen) >= 2 and not crashed:  # the batch holding the second record fails
            crashed.append(1)
            raise RuntimeError("bug")
        original(self, shapes)

    monkeypatch.setattr(TraceWriter, "write_many", flaky)
    recorder, metrics = make(tmp_path, retry_s=0.05)
    recorder.start()
    recorder.finished(cap(0))
    recorder.finished(cap(1))
    wait_for(lambda: sample(metrics, "replayproxy_recorder_errors_total", kind="crash") == 1)
    time.sleep(0.1)
    recorder.finished(cap(2))
    recorder.close()
    assert (
        sample(metrics, "replayproxy_records_dropped_total", reason="writer_error") == 2
    )  # 0 (unflushed) and 1
    assert [s.input_tokens for s in shapes_of(tmp_path / "traces")] == [12]


def test_a_bad_capture_is_a_shape_error(tmp_path: Path) -> None:
    recorder, metrics = make(tmp_path)
    recorder.start()
    broken = cap()
    broken.event_stream = True
    broken.piece_ns.append(1)  # more times than pieces: extraction fails
    recorder.finished(broken)
    recorder.finished(cap(1))
    recorder.close()
    assert sample(metrics, "replayproxy_records_dropped_total", reason="shape_error") == 1
    assert sample(metrics, "replayproxy_records_written_total") == 1


def test_rotate_now_and_retention_by_count(tmp_path: Path) -> None:
    recorder, metrics = make(tmp_path, retain_files=2)
    recorder.start()
    for i in range(4):
        recorder.finished(cap(i))
        wait_for(lambda: not recorder.pending)
        recorder.rotate()
        wait_for(lambda: not recorder._rotate.is_set())
        time.sleep(0.01)
    recorder.close()
    files = recorder.files
    assert len(files) == 2 and sample(metrics, "replayproxy_trace_files") == 2
    assert sorted(s.input_tokens for s in shapes_of(files)) == [12, 13]


def test_a_deleted_trace_directory_is_noticed_recreated_and_its_records_counted_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder, metrics = make(tmp_path, flush_interval_s=0.1)
    recorder.start()
    for i in range(5):
        recorder.finished(cap(i))
    wait_for(lambda: sample(metrics, "replayproxy_records_written_total") == 5)
    shutil.rmtree(tmp_path / "traces")  # the open file goes with it
    wait_for(lambda: (tmp_path / "traces").is_dir(), timeout_s=2.0)  # within about a flush interval
    assert sample(metrics, "replayproxy_records_lost_total", reason="file_deleted") == 5
    assert any("was deleted while open: 5 records lost" in r.message for r in caplog.records)
    for i in range(3):
        recorder.finished(cap(10 + i))
    recorder.close()
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
    recorder, metrics = make(tmp_path, retry_s=0.05, flush_interval_s=0.02)
    recorder.start()
    deadline = now_ns() + 10**10
    while failures["left"] and now_ns() < deadline:  # each retry meets the full disk again
        recorder.finished(cap(0))
        time.sleep(0.03)
    assert not failures["left"]
    time.sleep(0.1)  # past retry_s: the disk has room again
    recorder.finished(cap(9))
    recorder.close()
    assert sample(metrics, "replayproxy_recorder_errors_total", kind="disk_full") >= 3
    files = list((tmp_path / "traces").glob("*.rpt"))
    report = ReadReport()
    tables = read_trace_files(files, report)
    assert all(table.n > 0 for _, table in tables) and report.skipped_files == 0
    assert 9 in [s.input_tokens - 10 for s in shapes_of(files)]
