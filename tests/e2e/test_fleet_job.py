"""The Kubernetes Indexed Job of tools/k8s, its command line run as N local processes: each reads the
trace from a real S3-compatible server on 127.0.0.1, sends its shard to the sim on one common
clock and writes its results to the store; the shards hold whole sessions, none twice, and
`report` merges them from the store into one run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml

from replayproxy import clock
from replayproxy.results import load_results
from replayproxy.trace import load
from tests import servers
from tests.cli import run_cli
from tests.s3server import s3_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def _job() -> dict[str, object]:
    docs = yaml.safe_load_all((ROOT / "tools/k8s/replay-fleet-job.yaml").read_text())
    return next(d for d in docs if d and d["kind"] == "Job")


def test_the_indexed_job_runs_as_local_processes_and_keeps_sessions_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _job()
    spec = job["spec"]  # type: ignore[index]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    shards = spec["completions"]
    container = spec["template"]["spec"]["containers"][0]
    script = container["args"][0]
    assert container["command"] == ["/bin/sh", "-c"]
    assert f'--shard "${{JOB_COMPLETION_INDEX}}/{shards}"' in script and "--start-at" in script
    assert '-o "${RESULTS_URL}/' in script and '"${TRACES_URL}"' in script
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TRACES_URL"].startswith("s3://") and env["RESULTS_URL"].startswith("s3://")

    trace = tmp_path / "t.rpt"
    made = run_cli("synth", "-o", str(trace), "--requests", "160", "--rate", "40", "--sessions-share", "0.8",
                   "--turns", "uniform:2,5", "--think", "0.3", "--input-len", "uniform:20,60",
                   "--output-len", "uniform:2,6", "--seed", "7")  # fmt: skip
    assert made.returncode == 0, made.stderr
    with s3_server(monkeypatch) as s3:
        s3.make_bucket("fleet")
        s3.client().upload_file(str(trace), "fleet", "traces/date=2026-12-07/hour=13/pod=a/t.rpt")  # type: ignore[attr-defined]
        with servers.sim("--speed", "20") as sim:
            start = f"{clock.wall_ns() / 1e9 + 15:.3f}"
            local = {
                **os.environ,
                **s3.env,
                "TRACES_URL": "s3://fleet/traces/date=2026-12-07/",
                "RESULTS_URL": "s3://fleet/replays/staging",
                "TARGET_URL": sim.url,
                "START_AT": start,
                "TMPDIR": str(tmp_path),
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            }
            pods = []
            try:
                for i in range(shards):
                    with (tmp_path / f"pod{i}.err").open("wb") as err:
                        pods.append(
                            subprocess.Popen(
                                ["/bin/sh", "-c", script],
                                env={**local, "JOB_COMPLETION_INDEX": str(i)},
                                stdout=subprocess.DEVNULL,
                                stderr=err,
                                start_new_session=True,  # its own group, as every process a test starts
                            )
                        )
                codes = [pod.wait(180) for pod in pods]
            finally:
                for pod in pods:
                    if pod.poll() is None:
                        os.killpg(pod.pid, signal.SIGKILL)
                        pod.wait()
        errors = [(tmp_path / f"pod{i}.err").read_text() for i in range(shards)]
        assert codes == [0] * shards, errors
        assert s3.keys("fleet", "replays/") == [f"replays/staging/shard-{i}.rpr" for i in range(shards)]
        results = load_results(["s3://fleet/replays/staging/"])
        reported = run_cli("report", "s3://fleet/replays/staging/", "--json")
        shown = run_cli("report", "s3://fleet/replays/staging/")
    assert reported.returncode == 0, reported.stderr
    (run,) = json.loads(reported.stdout)["runs"]
    assert run["shards"] == shards

    # Each shard says where its clock stood against the shared start, beside its lag. Here all
    # share this host's clock, and so the target's: the measured offset bounds 0.
    start_at_ns = int(float(start) * 1e9)
    for result in results:
        clocks = result.header.clock
        assert clocks["start_at_ns"] == start_at_ns and clocks["ready_before_start_ns"] > 0
        assert abs(clocks["wall_drift_ns"]) < 50_000_000
        reference = clocks["reference"]
        assert reference["source"] == "target Date header" and reference["bound_ns"] < 600_000_000
        assert abs(reference["offset_ns"]) <= reference["bound_ns"] + 20_000_000, reference
    by_shard = {c["shard"]: c for c in run["shard_clocks"]}
    assert sorted(by_shard) == [f"{i}/{shards}" for i in range(shards)]
    assert all(c["lag_p99_ms"] is not None and c["clock_offset_ms"] is not None for c in by_shard.values())
    assert (
        shown.returncode == 0
        and "schedule lag and clock" in shown.stdout
        and "clock offset ms" in shown.stdout
    )

    cols = load(trace)
    owner: dict[int, int] = {}
    sessions: dict[int, set[int]] = defaultdict(set)
    for result in results:
        shard = int(result.header.shard.split("/")[0])
        for index in result.column("index").tolist():
            assert index not in owner, f"request {index} sent by two shards"
            owner[index] = shard
            if cols.session[index]:
                sessions[int(cols.session[index])].add(shard)
    assert sorted(owner) == list(range(len(cols)))  # every request, once
    assert sessions and all(len(s) == 1 for s in sessions.values()), "a session split across shards"
    assert len(set(owner.values())) == shards  # every shard got work
    starts = np.array([r.header.start_wall_ns for r in results])
    assert int(starts.max() - starts.min()) < 50_000_000  # one clock for all pods
    assert not any(any(r.column("error")) for r in results)
