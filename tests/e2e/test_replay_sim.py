"""`replayproxy replay` against the real simulated engine, checked against its ground-truth log."""

from __future__ import annotations

import contextlib
import heapq
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from replayproxy import clock
from replayproxy.cli import main
from replayproxy.replay import synth
from replayproxy.results import ResultFile, load_results
from replayproxy.trace import load
from tests.replay import traces
from tests.servers import Server, sim

pytestmark = pytest.mark.slow


_TICKS = "import itertools, time; [print(i, 1) or time.sleep(0.05) for i in itertools.count()]"
GPU_SAMPLER = f"{sys.executable} -u -c '{_TICKS}'"  # stands in for `nvidia-smi ... --format=csv -lms 50`


def truth(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def first_content_wall_ns(record: dict[str, Any]) -> int:
    index = next(i for i, kind in enumerate(record["kinds"]) if kind in "cRb")
    return int(record["chunk_ns"][index])


@contextlib.contextmanager
def separate_cores(server: Server) -> Iterator[None]:
    """The sim on the last core, this process (the replayer) on the others: as with a remote target,
    the sim's wake-ups on loopback writes then cannot preempt the sender on its own core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        yield
        return
    os.sched_setaffinity(server.process.pid, {cores[-1]})
    os.sched_setaffinity(0, set(cores[:-1]))
    try:
        yield
    finally:
        os.sched_setaffinity(0, set(cores))


def replay(trace: Path, url: str, out: Path, *extra: str) -> ResultFile:
    code = main(
        ["replay", str(trace), "--target", url, "-o", str(out), "--flavor", "vllm", "--quiet", *extra]
    )
    assert code == 0
    return load_results([out])[0]


def lags_ms(result: ResultFile) -> np.ndarray:
    return (result.column("sent_ns") - result.column("scheduled_ns")) / 1e6


@pytest.fixture(scope="module")
def mixed_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Chat with shared system prompts and multi-turn sessions, plus token-id completions."""
    chat = traces.synthetic_shapes(
        requests=120,
        rate_rps=15.0,
        prefix_groups=3,
        prefix_len_tokens=256,
        sessions_share=0.4,
        think_s=1.0,
        input_len="lognormal:mean=300,sigma=0.5",
        output_len="uniform:4,40",
    )
    completions = traces.synthetic_shapes(
        requests=60,
        rate_rps=7.5,
        endpoint="completions",
        prefix_groups=2,
        prefix_len_tokens=128,
        input_len="uniform:64,400",
        output_len="uniform:4,40",
        seed=2,
    )
    merged = list(heapq.merge(chat, completions, key=lambda s: s.offset_ns))
    return traces.write(tmp_path_factory.mktemp("replay") / "mixed.rpt", merged)


@pytest.mark.serial  # pins the sim and the replayer to separate cores; bounds in milliseconds
def test_replay_is_faithful_to_the_trace_and_to_the_clock(mixed_trace: Path, tmp_path: Path) -> None:
    truth_log = tmp_path / "truth.jsonl"
    with sim("--truth-log", str(truth_log), "--speed", "2") as server, separate_cores(server):
        # open loop: every request at its recorded offset, which the ground truth checks below pair
        options = ("--label", "sim", "--sessions", "open", "--scrape-metrics", "--scrape-interval", "0.1")
        result = replay(mixed_trace, server.url, tmp_path / "run.rpr", *options, "--gpu-sampler", GPU_SAMPLER)
    cols = load(mixed_trace)
    assert len(result) == len(cols) and set(result.column("index").tolist()) == set(range(len(cols)))
    assert not any(result.column("error"))
    header = result.header
    assert header.flavor == "vllm" and header.pre_run["reset_prefix_cache"] == "ok"
    assert header.engine_version and header.models["data"][0]["id"] == traces.SIM_MODEL
    assert header.token_timing == "token" and len(header.trace_digest) == 64
    prompts = header.pre_run["prompts"]  # the sim answers /tokenize: prompts are exact by construction
    assert prompts["lengths"] == "exact" and prompts["check"]["exact"] == prompts["check"]["checked"] > 0

    # lengths: the target counted exactly the trace's input and output tokens
    index = result.column("index")
    assert np.mean(result.column("prompt_tokens") == cols.input_tokens[index]) >= 0.99
    assert np.mean(result.column("completion_tokens") == cols.output_tokens[index]) >= 0.99

    # prefix sharing: the sim's cache hits are the trace's reuse (all requests of one endpoint
    # share blocks with earlier ones of the same endpoint only here, so the trace says exactly what to expect)
    owners = synth.first_owners(cols.prefix_hashes, cols.prefix_index)
    expected = np.array([synth.shared_blocks(owners, cols.prefix_index, r) * 16 for r in range(len(cols))])
    cached = result.column("cached_tokens")
    assert np.all(cached <= expected[index])  # never more sharing than recorded
    assert np.mean(cached == expected[index]) >= 0.9  # fewer only while a donor's prefill is still running
    assert expected.sum() > 10_000
    profile = result.extras["trace_profile"][0]
    assert profile["prefix_reuse"] == pytest.approx(expected.sum() / cols.input_tokens.sum())

    # engine telemetry and GPU samples were taken beside the run (in a child process)
    telemetry = result.extras["telemetry"][0]
    assert telemetry["errors"] == 0 and len(telemetry["samples"]) >= 10
    assert "vllm:num_requests_running" in telemetry["found"].values()
    gpu = result.extras["gpu"][0]
    assert len(gpu["lines"]) >= 10 and gpu["lines"][-1][1].endswith(" 1")

    # timestamps against the sim's ground truth (wall clock; the result header anchors the run)
    start_wall = header.start_wall_ns
    by_lengths: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for record in truth(truth_log):
        if record["status"] == 200 and record["id"]:
            by_lengths.setdefault((record["prompt_tokens"], record["completion_tokens"]), []).append(record)
    errors_ms = []
    columns = ("sent_ns", "ttft_ns", "prompt_tokens", "completion_tokens")
    for sent, ttft, prompt, completion in zip(*(result.column(c).tolist() for c in columns), strict=True):
        sent_wall = start_wall + sent
        # the request the sim received first after this send, among those with these lengths
        record = min(by_lengths[(prompt, completion)], key=lambda r: abs(r["arrival_ns"] - sent_wall))
        errors_ms.append((sent_wall + ttft - first_content_wall_ns(record)) / 1e6)
    errors = np.array(errors_ms)
    # The sim stamps a chunk right *after* its write returns, so on a busy host its stamp can trail the
    # moment the bytes reached the client: the error is client read time minus that stamp, centred
    # on zero; it must be small, and a late client (positive tail) must stay rare.
    assert abs(np.percentile(errors, 50)) < 0.5
    assert np.percentile(errors, 5) >= -1.0 and np.percentile(errors, 95) < 5.0
    assert errors.max() < 20.0

    # schedule fidelity (the tight bound lives in benchmarks/replay_fidelity.py)
    assert np.percentile(lags_ms(result), 99) <= 5.0


def test_injected_faults_are_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    trace = traces.write_synthetic(
        tmp_path / "f.rpt", requests=80, rate_rps=40.0, input_len="uniform:20,80", output_len="uniform:20,40"
    )
    faults = (
        "--fail-rate",
        "0.15",
        "--reset-rate",
        "0.15",
        "--stall-rate",
        "0.15",
        "--stall-seconds",
        "3",
        "--seed",
        "5",
    )
    with sim("--speed", "10", *faults) as server:
        result = replay(trace, server.url, tmp_path / "f.rpr", "--timeout", "1")
    errors = result.column("error").tolist()
    assert len(errors) == 80
    assert {"http_5xx", "reset", "timeout"} <= set(errors)
    assert errors.count("") >= 30
    footer = result.footer["summary"]
    assert footer["errors"] == 80 - errors.count("") and footer["errors_by_class"]["http_5xx"] >= 1


def test_speed_two_halves_the_span(tmp_path: Path) -> None:
    trace = traces.write_synthetic(
        tmp_path / "s.rpt", requests=40, rate_rps=20.0, input_len="uniform:20,60", output_len="uniform:2,6"
    )
    with sim("--speed", "20") as server:
        normal = replay(trace, server.url, tmp_path / "x1.rpr", "--no-calibrate")
        fast = replay(trace, server.url, tmp_path / "x2.rpr", "--speed", "2", "--no-calibrate")
    span_1 = np.ptp(normal.column("sent_ns"))
    span_2 = np.ptp(fast.column("sent_ns"))
    assert span_2 == pytest.approx(span_1 / 2, rel=0.05)
    assert np.array_equal(fast.column("scheduled_ns") * 2, normal.column("scheduled_ns")) or np.allclose(
        fast.column("scheduled_ns") * 2, normal.column("scheduled_ns"), atol=2
    )


def _replay_process(trace: Path, url: str, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "replayproxy", "replay", str(trace), "--target", url, "-o", str(out)]
        + ["--flavor", "vllm", "--quiet", "--sessions", "open", *extra],
        stderr=subprocess.PIPE,
        text=True,
        # A shell without job control starts background jobs with SIGINT ignored, and a child
        # inherits that: give the replayer the default, as a terminal would.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for_lines(path: Path, count: int) -> None:
    for _ in range(1200):  # well into the trace, however slow the workers' start on a busy machine
        if path.exists() and len(path.read_bytes().splitlines()) >= count:
            return
        time.sleep(0.05)


def test_an_interrupted_two_worker_replay_keeps_every_result(tmp_path: Path) -> None:
    trace = traces.write_synthetic(
        tmp_path / "long.rpt", requests=150, rate_rps=10.0, input_len="uniform:20,60", output_len="fixed:4"
    )
    truth_log, out = tmp_path / "truth.jsonl", tmp_path / "partial.rpr"
    with sim("--speed", "20", "--truth-log", str(truth_log)) as server:
        process = _replay_process(trace, server.url, out, "--workers", "2")
        _wait_for_lines(truth_log, 12)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        answered = len(truth(truth_log))  # every request the engine saw, answered or cut off
    assert process.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    result = load_results([out])[0]
    indices = result.column("index").tolist()
    errors = result.column("error").tolist()
    assert len(set(indices)) == len(indices) and 12 <= len(indices) < 150
    assert set(result.column("worker").tolist()) == {0, 1}  # both workers' results came back
    assert len(indices) >= answered  # nothing the engine saw is missing from the file
    assert errors.count("") >= 10 and set(errors) <= {"", "client_cancel"}
    summary = result.footer["summary"]
    assert summary["partial"] is True and summary["planned_requests"] == 150
    assert f"{len(indices)} results in {out}" in err


@pytest.mark.serial  # two pods must start within the 6 s lead they are given
def test_workers_and_shards_split_the_trace(tmp_path: Path) -> None:
    trace = traces.write_synthetic(
        tmp_path / "w.rpt", requests=40, rate_rps=40.0, input_len="uniform:20,60", output_len="uniform:2,6"
    )
    with sim("--speed", "20") as server:
        merged = replay(trace, server.url, tmp_path / "w.rpr", "--workers", "2")
        # two "pods" started independently share this start, after both measured the sim's tokenizer
        start = f"{clock.wall_ns() / 1e9 + 6:.3f}"
        pods = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "replayproxy",
                    "replay",
                    str(trace),
                    "--target",
                    server.url,
                    "-o",
                    str(tmp_path / f"s{i}.rpr"),
                    "--flavor",
                    "vllm",
                    "--quiet",
                    "--shard",
                    f"{i}/2",
                    "--start-at",
                    start,
                ],
                stdout=subprocess.DEVNULL,
            )
            for i in range(2)
        ]
        assert [pod.wait(60) for pod in pods] == [0, 0]
    shards = load_results([tmp_path / "s0.rpr", tmp_path / "s1.rpr"])
    assert sorted(merged.column("index").tolist()) == list(range(40))
    assert set(merged.column("worker").tolist()) == {0, 1}
    assert not any(merged.column("error"))
    assert [s.header.shard for s in shards] == ["0/2", "1/2"]
    first, second = (set(s.column("index").tolist()) for s in shards)
    assert first and second and not first & second and sorted(first | second) == list(range(40))
    starts = [s.header.start_wall_ns for s in shards]
    assert abs(starts[0] - starts[1]) < 5_000_000  # one start time for both pods
    assert abs(starts[0] - float(start) * 1e9) < 5_000_000
