"""Traces and results read from object-store URLs, against a real S3-compatible server on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from replayproxy import trace
from replayproxy.trace import storage
from tests.cli import run_cli
from tests.s3server import ACCESS_KEY, S3, SECRET_KEY, s3_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    with s3_server(monkeypatch) as server:
        server.make_bucket("fleet")
        yield server


def _synth(path: Path, seed: int, requests: int = 300) -> Path:
    result = run_cli("synth", "-o", str(path), "--requests", str(requests), "--seed", str(seed),
                     "--sessions-share", "0.5", "--prefix-groups", "3", "--prefix-len", "200")  # fmt: skip
    assert result.returncode == 0, result.stderr
    return path


def _upload(s3: S3, local: Path, key: str) -> None:
    s3.client().upload_file(str(local), "fleet", key)  # type: ignore[attr-defined]


def test_a_prefix_reads_as_the_same_trace_as_its_local_files(tmp_path: Path, s3: S3) -> None:
    a, b = _synth(tmp_path / "a.rpt", 1), _synth(tmp_path / "b.rpt", 2, 1500)  # b: over a mapped file's size
    _upload(s3, a, "traces/date=2026-12-07/hour=13/pod=p0/a.rpt")
    _upload(s3, b, "traces/date=2026-12-07/hour=14/pod=p1/b.rpt")
    _upload(s3, tmp_path / "a.rpt", "traces/notes/readme.txt")  # not a trace by name: left out

    local = trace.load([a, b])
    for url in ("s3://fleet/traces", "s3://fleet/traces/", "s3://fleet/traces/**/*.rpt"):
        remote = trace.load([url])
        assert len(remote) == len(local) == 1800
        assert (remote.offset_ns == local.offset_ns).all()
        assert (remote.prefix_hashes == local.prefix_hashes).all()
        assert remote.report.paths == [
            "s3://fleet/traces/date=2026-12-07/hour=13/pod=p0/a.rpt",
            "s3://fleet/traces/date=2026-12-07/hour=14/pod=p1/b.rpt",
        ]

    shown = run_cli("inspect", "--json", "s3://fleet/traces/date=2026-12-07/**")
    assert shown.returncode == 0, shown.stderr
    here = run_cli("inspect", "--json", str(a), str(b))
    assert json.loads(shown.stdout)["requests"] == json.loads(here.stdout)["requests"]
    for text in (shown.stdout, shown.stderr):
        assert ACCESS_KEY not in text and SECRET_KEY not in text


def test_a_digest_of_a_remote_trace_equals_the_local_one(tmp_path: Path, s3: S3) -> None:
    a = _synth(tmp_path / "a.rpt", 3)
    _upload(s3, a, "one/a.rpt")
    local, remote = trace.load(a, digest=True), trace.load("s3://fleet/one/a.rpt", digest=True)
    assert remote.report.content.hexdigest() == local.report.content.hexdigest()


def test_a_file_url_is_a_local_path(tmp_path: Path) -> None:
    a = _synth(tmp_path / "a.rpt", 4)
    assert storage.expand([f"file://{a}"], ".rpt") == [a]
    assert len(trace.load(f"file://{tmp_path}")) == 300


def test_missing_objects_and_stores_are_one_line(tmp_path: Path, s3: S3) -> None:
    for url, words in (
        ("s3://fleet/nothing/here/**", "no such file"),
        ("s3://fleet/nothing", "no such file"),
        ("s3://no-such-bucket/x.rpt", "no such file"),
        ("nosuch://bucket/x.rpt", "unknown storage scheme"),
    ):
        result = run_cli("inspect", url)
        assert result.returncode == 2, (url, result.stderr)
        assert words in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert SECRET_KEY not in result.stderr


def test_a_store_whose_client_is_missing_says_what_to_install() -> None:
    pytest.importorskip("fsspec")
    for scheme, package in storage.SCHEMES.items():
        try:
            __import__(package)
        except ImportError:
            result = run_cli("inspect", f"{scheme}://bucket/x.rpt")
            assert result.returncode == 2
            assert "replayproxy[storage]" in result.stderr and package in result.stderr
            return
    pytest.skip("every store's client is installed")


def test_results_written_and_read_through_a_url(tmp_path: Path, s3: S3) -> None:
    a = _synth(tmp_path / "a.rpt", 5)
    storage.put(a, "s3://fleet/put/x/a.rpt")
    assert s3.keys("fleet", "put/") == ["put/x/a.rpt"]
    assert storage.read_bytes(trace.storage.expand(["s3://fleet/put"], ".rpt")[0]) == a.read_bytes()
