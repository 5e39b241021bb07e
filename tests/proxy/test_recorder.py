"""The recorder seen from the proxy process (proxy/recording/recorder.py): a bounded queue in front of a real
recorder process; its counts and log lines come back, a dead one is counted and replaced, close
writes everything, and the process never outlives its recorder."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replayproxy.proxy.metrics import ProxyMetrics
from replayproxy.proxy.prompt import PromptHasher
from replayproxy.proxy.recording.recorder import STUCK_S, Recorder
from replayproxy.trace import ReadReport, read_trace_files
from tests.proxy.helpers import ended, run, settings
from tests.proxy.test_record_core import KEY, cap
from tests.trace.helpers import shapes_of


def make(tmp_path: Path, **overrides: Any) -> tuple[Recorder, ProxyMetrics]:
    metrics = ProxyMetrics()
    s = settings("http://user:pw@127.0.0.1:9/base", tmp_path / "traces", **overrides)
    return Recorder(s, metrics, PromptHasher(KEY)), metrics


def sample(metrics: ProxyMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


def test_records_go_through_the_recorder_process_and_its_counts_come_back(tmp_path: Path) -> None:
    recorder, metrics = make(tmp_path)

    async def main() -> int:
        recorder.start()
        await until(lambda: recorder.child_pid is not None)
        pid = recorder.child_pid
        assert pid is not None and pid != os.getpid()
        for i in range(5):
            recorder.finished(cap(i))
        await recorder.close()
        return pid

    pid = run(main())
    assert ended(pid) and recorder.child_pid is None
    report = ReadReport()
    [(header, table)] = read_trace_files([tmp_path / "traces"], report)
    assert table.n == 5 and report.footers == 1 and header.upstream == "http://127.0.0.1:9/base"
    assert sorted(s.input_tokens for s in shapes_of(tmp_path / "traces")) == [10, 11, 12, 13, 14]
    assert sample(metrics, "replayproxy_records_written_total") == 5
    [path] = (tmp_path / "traces").glob("*.rpt")
    assert sample(metrics, "replayproxy_trace_bytes_written_total") == path.stat().st_size
    assert sample(metrics, "replayproxy_input_tokens_total", endpoint="chat") == 60
    assert sample(metrics, "replayproxy_e2e_seconds_count", endpoint="chat") == 5
    assert sample(metrics, "replayproxy_trace_files") == 1
    assert sample(metrics, "replayproxy_writer_queue_depth") == 0 and recorder.failing == ""


def test_a_full_queue_drops_and_counts(tmp_path: Path) -> None:
    recorder, metrics = make(tmp_path, queue_records=3)
    for i in range(5):  # not started, so nothing drains the queue
        recorder.finished(cap(i))
    assert sample(metrics, "replayproxy_records_dropped_total", reason="queue_full") == 2
    assert sample(metrics, "replayproxy_writer_queue_depth") == 3
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


def test_close_writes_everything_queued_a_moment_before(tmp_path: Path) -> None:
    recorder, metrics = make(tmp_path)

    async def main() -> None:
        recorder.start()
        for i in range(300):  # the process may not even be up yet
            recorder.finished(cap(i))
        await recorder.close()

    run(main())
    assert len(shapes_of(tmp_path / "traces")) == 300
    assert sample(metrics, "replayproxy_records_written_total") == 300
    assert sample(metrics, "replayproxy_records_dropped_total", reason="recorder_exited") == 0


def test_a_killed_recorder_process_is_counted_logged_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder, metrics = make(tmp_path, flush_interval_s=30.0, retry_s=0.2)
    recorder.failing_window_ns = 200_000_000  # the drop of its three records shows this long

    async def main() -> tuple[int, int, str]:
        recorder.start()
        for i in range(3):
            recorder.finished(cap(i))
        await until(lambda: recorder.child_pid is not None and recorder.pending == 0)
        first = recorder.child_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)  # its three records are not flushed yet (30 s interval)
        await until(lambda: recorder.failing != "")
        failing = recorder.failing
        await until(lambda: recorder.child_pid not in (None, first) and recorder.failing == "")
        second = recorder.child_pid
        assert second is not None
        recorder.finished(cap(7))
        recorder.finished(cap(8))
        await recorder.close()
        return first, second, failing

    first, second, failing = run(main())
    assert failing == "crash: the recorder process exited (signal SIGKILL)"
    assert ended(first) and ended(second)
    assert sample(metrics, "replayproxy_records_dropped_total", reason="recorder_exited") == 3
    assert sample(metrics, "replayproxy_recorder_errors_total", kind="crash") == 1
    assert sample(metrics, "replayproxy_records_written_total") == 2
    assert sorted(s.input_tokens for s in shapes_of(recorder.files)) == [17, 18]
    assert sum("recorder process exited" in r.message for r in caplog.records) == 1


def test_rotate_reaches_the_recorder_process(tmp_path: Path) -> None:
    recorder, metrics = make(tmp_path)

    async def main() -> None:
        recorder.start()
        recorder.finished(cap(0))
        await until(lambda: recorder.pending == 0 and len(recorder.files) == 1)
        recorder.rotate()
        await until(lambda: sample(metrics, "replayproxy_records_written_total") == 1)
        recorder.finished(cap(1))
        await recorder.close()

    run(main())
    report = ReadReport()
    tables = read_trace_files(recorder.files, report)
    assert [table.n for _, table in tables] == [1, 1] and report.footers == 2


def test_the_recorder_process_logs_through_the_proxy_and_reports_failing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "traces"
    blocker.write_text("a file where the directory should be")
    recorder, metrics = make(tmp_path, retry_s=60.0)

    async def main() -> str:
        recorder.start()
        for i in range(3):
            recorder.finished(cap(i))
        await until(lambda: sample(metrics, "replayproxy_records_dropped_total", reason="writer_error") == 3)
        failing = recorder.failing
        await recorder.close()
        return failing

    failing = run(main())
    assert failing.startswith("io: ") and sample(metrics, "replayproxy_recorder_errors_total", kind="io") == 1
    assert sample(metrics, "replayproxy_recording_failing") == 1
    assert sum("trace writing failed" in r.message for r in caplog.records) == 1


def test_the_hash_key_reaches_the_recorder_process_only_through_its_pipe(tmp_path: Path) -> None:
    recorder, _ = make(tmp_path)

    async def main() -> tuple[bytes, bytes]:
        recorder.start()
        await until(lambda: recorder.child_pid is not None)
        pid = recorder.child_pid
        seen = Path(f"/proc/{pid}/cmdline").read_bytes(), Path(f"/proc/{pid}/environ").read_bytes()
        await recorder.close()
        return seen

    cmdline, environ = run(main())
    assert b"recording.child" in cmdline
    for text in (cmdline, environ):
        assert KEY[:8] not in text and KEY.hex()[:16].encode() not in text


def test_a_stalled_recorder_process_costs_drops_never_a_wait(tmp_path: Path) -> None:
    """Stopped (SIGSTOP), the recorder process reads nothing: what waits for it, queued here or in
    the pipe, stays within queue_records and the rest is dropped and counted at once."""
    recorder, metrics = make(tmp_path, queue_records=5)

    async def main() -> None:
        recorder.start()
        await until(lambda: recorder.child_pid is not None and recorder.failing == "")
        await asyncio.sleep(0.3)  # its first report is in: it runs
        pid = recorder.child_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            for i in range(20):
                recorder.finished(cap(i))  # returns at once, whatever the child does
                await asyncio.sleep(0.03)  # the timer hands each one to the pipe
            assert recorder.pending == 5
        finally:
            os.kill(pid, signal.SIGCONT)
        await recorder.close()

    run(main())
    assert sample(metrics, "replayproxy_records_dropped_total", reason="queue_full") == 15
    assert sample(metrics, "replayproxy_records_written_total") == 5
    assert len(shapes_of(tmp_path / "traces")) == 5


def test_the_recorder_process_runs_on_the_proxys_cpus_unless_told_otherwise(tmp_path: Path) -> None:
    last = max(os.sched_getaffinity(0))

    async def placed(recorder: Recorder, metrics: ProxyMetrics) -> set[int]:
        recorder.start()
        recorder.finished(cap(0))
        await until(lambda: sample(metrics, "replayproxy_records_written_total") == 1)  # placed by then
        pid = recorder.child_pid
        assert pid is not None
        cpus = os.sched_getaffinity(pid)
        await recorder.close()
        return cpus

    assert run(placed(*make(tmp_path / "default"))) == os.sched_getaffinity(0)
    assert run(placed(*make(tmp_path / "told", recorder_cpus=str(last)))) == {last}


def test_any_drop_turns_failing_on_for_the_window_and_then_off(tmp_path: Path) -> None:
    recorder, metrics = make(tmp_path, queue_records=1)
    recorder.failing_window_ns = 200_000_000
    recorder.finished(cap(0))
    assert recorder.failing == ""
    recorder.finished(cap(1))  # not started, so nothing drains the queue: dropped
    assert recorder.failing == "dropping records (queue_full)"
    assert metrics.registry.get_sample_value("replayproxy_recording_failing") == 1.0
    time.sleep(0.25)
    assert (
        recorder.failing == "" and metrics.registry.get_sample_value("replayproxy_recording_failing") == 0.0
    )


def test_records_waiting_unread_mean_a_stuck_recorder_before_anything_is_dropped(tmp_path: Path) -> None:
    recorder, _ = make(tmp_path)

    async def main() -> tuple[str, str]:
        recorder.start()
        await until(lambda: recorder.child_pid is not None and recorder.failing == "")
        await asyncio.sleep(0.3)  # its first report is in: it runs
        pid = recorder.child_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            recorder.finished(cap(0))
            await until(lambda: recorder.failing != "", timeout_s=STUCK_S + 5)
            stuck = recorder.failing
        finally:
            os.kill(pid, signal.SIGCONT)
        await until(lambda: recorder.failing == "")
        recovered = recorder.failing
        await recorder.close()
        return stuck, recovered

    stuck, recovered = run(main())
    assert stuck == f"stuck: the recorder process read nothing for over {STUCK_S:g} s" and recovered == ""
