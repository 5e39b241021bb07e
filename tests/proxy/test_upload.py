"""Rotated trace files to object storage: partitioned names, retries with backoff, local copies removed
only once uploaded. Against a real S3-compatible server on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from replayproxy.proxy.recording.upload import SegmentUploader, object_url, partition, pod_name
from tests.s3server import S3, s3_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    with s3_server(monkeypatch) as server:
        yield server


def _wait(condition: object, timeout_s: float = 30.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.perf_counter() < deadline, "timed out"
        time.sleep(0.05)


def test_names_are_partitioned_by_the_hour_the_file_was_opened(tmp_path: Path) -> None:
    path = tmp_path / "trace-20261207T135959Z-0003.rpt"
    assert partition(path) == ("2026-12-07", "13")
    assert (
        object_url("s3://b/fleet/", "pod-a", path)
        == "s3://b/fleet/date=2026-12-07/hour=13/pod=pod-a/trace-20261207T135959Z-0003.rpt"
    )


def test_the_pod_name_comes_from_the_setting_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "replay-7f/x")
    monkeypatch.setenv("HOSTNAME", "host-1")
    assert pod_name("given") == "given"
    assert pod_name() == "replay-7f_x"  # never a path separator
    monkeypatch.delenv("POD_NAME")
    assert pod_name() == "host-1"


def test_failed_uploads_are_retried_and_counted_and_files_kept_until_uploaded(tmp_path: Path, s3: S3) -> None:
    files = [tmp_path / f"trace-20261207T1300{i:02d}Z-{i:04d}.rpt" for i in range(3)]
    for i, f in enumerate(files):
        f.write_bytes(bytes([i]) * (1000 + i))
    uploader = SegmentUploader("s3://later/fleet", "p0", retry_s=0.05)
    uploader.start()
    try:
        uploader.offer(files)
        _wait(lambda: uploader.take_counts()[1] >= 2 or None)  # no bucket yet: attempts fail
        assert all(f.exists() for f in files)  # kept while not uploaded
        s3.make_bucket("later")
        _wait(lambda: not any(f.exists() for f in files))
        assert s3.keys("later") == [f"fleet/date=2026-12-07/hour=13/pod=p0/{f.name}" for f in files]
        uploaded, _, lost, _ = uploader.take_counts()
        assert uploaded == 3 and lost == 0
        body = s3.client().get_object(Bucket="later", Key=s3.keys("later")[2])["Body"].read()  # type: ignore[attr-defined]
        assert body == bytes([2]) * 1002
    finally:
        uploader.close(1.0)


def test_a_file_removed_before_its_upload_is_counted_lost(tmp_path: Path, s3: S3) -> None:
    s3.make_bucket("bucket")
    gone = tmp_path / "trace-20261207T130000Z-0001.rpt"
    uploader = SegmentUploader("s3://bucket/x", "p0", retry_s=0.05)
    uploader.offer([gone])  # offered, then removed (retention) before the thread starts
    uploader.start()
    try:
        _wait(lambda: uploader.waiting == 0)
        assert uploader.take_counts()[:3] == (0, 0, 1)
        assert s3.keys("bucket") == []
    finally:
        uploader.close(1.0)
