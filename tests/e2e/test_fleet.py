"""A fleet of sidecars into object storage, read back as one workload.

Three proxies share one hash key and upload their rotated files to a real S3-compatible server on
127.0.0.1; a round-robin router sends the turns of each conversation to different proxies. The
bucket's prefix then reads as one trace: every request once (a segment uploaded twice is read
once), in arrival order across pods, each conversation one session though its turns were recorded
by different pods; `replay` runs it from the URL and writes its results to the store, `report`
reads them from there. No credential reaches a trace, a log line, a metric or a result.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from replayproxy.cli import main
from replayproxy.results import load_results
from replayproxy.trace import load
from tests import conversations, servers
from tests.cli import run_cli
from tests.replay import traces
from tests.s3server import ACCESS_KEY, SECRET_KEY, gets, s3_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PODS = ("pod-a", "pod-b", "pod-c")
CONVERSATIONS, TURNS = 6, 3


def _proxy(engine: str, trace_dir: Path, key: Path, pod: str) -> object:
    return servers.start_proxy(
        engine, trace_dir, "--hash-key-file", str(key), "--upload-url", "s3://fleet/traces",
        "--pod-name", pod, "--upload-retry-s", "0.2",
    )  # fmt: skip


def _wait(condition: object, timeout_s: float = 60.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.perf_counter() < deadline, "timed out"
        time.sleep(0.1)


def test_three_sidecars_behind_a_round_robin_router_read_back_as_one_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "hash.key"
    key.write_text(secrets.token_hex(32))
    key.chmod(0o600)
    dirs = [tmp_path / pod for pod in PODS]
    outputs: list[str] = []
    metrics: list[str] = []
    with s3_server(monkeypatch) as s3:
        s3.make_bucket("fleet")
        with servers.sim("--speed", "20") as engine:
            proxies = [_proxy(engine.url, d, key, pod) for d, pod in zip(dirs, PODS, strict=True)]
            with proxies[0] as a, proxies[1] as b, proxies[2] as c:  # type: ignore[attr-defined]
                urls = [a.url, b.url, c.url]
                asyncio.run(conversations.send(urls, traces.SIM_MODEL, CONVERSATIONS, TURNS, echo=True))
                a.process.send_signal(signal.SIGHUP)  # rotate pod-a now: uploaded while it runs
                _wait(lambda: any("pod=pod-a" in k for k in s3.keys("fleet")))
                _wait(lambda: not list(dirs[0].glob("*.rpt")))  # removed once uploaded
                _wait(lambda: _UPLOADED in _metrics(a.output))  # counted, while the others' wait
                metrics.extend(_metrics(p.output) for p in (a, b, c))
                asyncio.run(
                    conversations.send(urls, traces.SIM_MODEL, 2, TURNS, echo=True)
                )  # after the rotation
            for proxy in (a, b, c):
                outputs.extend(proxy.output)
        keys = s3.keys("fleet", "traces/")
        for pod, d in zip(PODS, dirs, strict=True):
            assert any(f"/pod={pod}/" in k for k in keys), keys
            assert not list(d.glob("*.rpt")), f"{d}: files left after upload"
        assert all(k.split("/")[1].startswith("date=") and k.split("/")[2].startswith("hour=") for k in keys)

        # a segment uploaded twice (a retry after a lost acknowledgement, under another pod's name)
        first = keys[0]
        s3.client().copy_object(Bucket="fleet", Key=first.replace("/pod=", "/pod=dup-"),  # type: ignore[attr-defined]
                                CopySource={"Bucket": "fleet", "Key": first})  # fmt: skip

        requests = (CONVERSATIONS + 2) * TURNS
        cols = load(["s3://fleet/traces/**"])
        assert len(cols) == requests and cols.report.duplicate_files == 1
        assert bool((cols.offset_ns[1:] >= cols.offset_ns[:-1]).all())  # arrival order across pods
        sessions = {int(s) for s in cols.session if s}
        assert len(sessions) == CONVERSATIONS + 2  # each conversation one session across three pods
        assert all(sum(1 for s in cols.session if s == session) == TURNS for session in sessions)
        assert sorted({int(t) for t in cols.turn}) == list(range(TURNS))

        shown = run_cli("inspect", "--json", "s3://fleet/traces/")
        assert shown.returncode == 0, shown.stderr
        stats = json.loads(shown.stdout)
        assert stats["requests"] == requests and stats["sessions"] == CONVERSATIONS + 2

        with servers.sim("--speed", "20") as sim:
            code = main(["replay", "s3://fleet/traces/date=*/hour=*/pod=*/*.rpt", "--target", sim.url,
                         "-o", "s3://fleet/results/run.rpr", "--flavor", "vllm", "--quiet"])  # fmt: skip
        assert code == 0
        assert s3.keys("fleet", "results/") == ["results/run.rpr"]
        (result,) = load_results(["s3://fleet/results/"])
        assert result.table.n == requests
        reported = run_cli("report", "s3://fleet/results/run.rpr", "--json")
        assert reported.returncode == 0, reported.stderr

        trace_bytes = b"".join(
            s3.client().get_object(Bucket="fleet", Key=k)["Body"].read()  # type: ignore[attr-defined]
            for k in s3.keys("fleet")
        )
    for secret in (ACCESS_KEY, SECRET_KEY):
        assert secret.encode() not in trace_bytes
        assert all(secret not in text for text in (*outputs, *metrics, shown.stdout, reported.stdout))


_UPLOADED = 'replayproxy_trace_uploads_total{outcome="uploaded"} 1.0'


def _metrics(output: list[str]) -> str:
    """What the proxy's admin listener serves on /metrics."""
    admin = next(line.split("admin listening on ", 1)[1] for line in output if "admin listening on" in line)
    with urllib.request.urlopen(f"{admin.strip()}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def test_a_replay_downloads_each_remote_segment_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay and its preparer process both read the trace: from one local copy, so the store
    serves each object one GET (the objects are smaller than one ranged read)."""
    keys = []
    log = tmp_path / "s3.log"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the local copies go, and are removed
    with s3_server(monkeypatch, log=log) as s3:
        s3.make_bucket("fleet")
        for seed in ("1", "2"):
            segment = tmp_path / f"t{seed}.rpt"
            made = run_cli("synth", "-o", str(segment), "--requests", "30", "--rate", "50", "--seed", seed,
                           "--input-len", "uniform:20,60", "--output-len", "uniform:2,6")  # fmt: skip
            assert made.returncode == 0, made.stderr
            keys.append(f"traces/date=2026-12-07/hour=13/pod=p{seed}/t.rpt")
            s3.client().upload_file(str(segment), "fleet", keys[-1])  # type: ignore[attr-defined]
        with servers.sim("--speed", "20") as sim:
            code = main(["replay", "s3://fleet/traces/", "--target", sim.url, "-o", str(tmp_path / "r.rpr"),
                         "--flavor", "vllm", "--quiet"])  # fmt: skip
    assert code == 0
    (result,) = load_results([tmp_path / "r.rpr"])
    assert result.table.n == 60 and not any(result.column("error"))
    assert [gets(log, f"fleet/{key}") for key in keys] == [1, 1]
    assert not list(tmp_path.glob("replayproxy-copies-*"))
