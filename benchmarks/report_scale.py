"""`replayproxy report` over 1,000,000 results on one core: must finish in <= 10 s (the report's budget).

Writes a synthetic result file once (cached under --workdir), then times each stage of a report
in this process, pinned to one CPU: load, measures, document (with an SLO and breakdowns), text
and JSON rendering. A second scenario times two runs of half the size each, which adds the
paired comparison and its bootstrap.

    .venv/bin/python benchmarks/report_scale.py [--requests 1000000] [--workdir /tmp/replayproxy-bench]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from replayproxy.clock import now_ns
from replayproxy.report.document import build_document
from replayproxy.report.goodput import parse_slo
from replayproxy.report.render_json import render_json
from replayproxy.report.render_text import render_text
from replayproxy.report.runs import load_runs
from replayproxy.results import ReplayResult, ResultWriter, RunHeader

GAPS_PER_REQUEST = 16


def write_results(path: Path, n: int, seed: int, label: str) -> None:
    """n requests at 300 req/s with lognormal latencies, 1% errors, two endpoints, 16 chunk gaps each."""
    rng = np.random.default_rng(seed)
    sent = np.cumsum(rng.exponential(1e9 / 300, n)).astype(np.int64)
    ttft = rng.lognormal(np.log(80e6), 0.6, n).astype(np.int64)
    gaps = rng.lognormal(np.log(20e3), 0.4, (n, GAPS_PER_REQUEST)).astype(np.int64)
    e2e = ttft + gaps.sum(axis=1) * 1000
    inputs = rng.lognormal(np.log(1500), 1.0, n).astype(np.int64)
    errors = np.where(rng.random(n) < 0.01, "http_5xx", "")
    endpoints = np.where(rng.random(n) < 0.8, "chat", "completions")
    header = RunHeader(label=label, target="http://bench", start_wall_ns=0, trace_digest="bench")
    with ResultWriter(path, header, frame_records=65536) as writer:
        for i in range(n):
            failed = bool(errors[i])
            writer.write(
                ReplayResult(
                    index=i,
                    scheduled_ns=int(sent[i]) - 200_000,
                    sent_ns=int(sent[i]),
                    endpoint=str(endpoints[i]),
                    ttft_ns=-1 if failed else int(ttft[i]),
                    e2e_ns=int(e2e[i]),
                    chunk_gaps_us=() if failed else tuple(gaps[i].tolist()),
                    content_chunks=0 if failed else 17,
                    status=500 if failed else 200,
                    error=str(errors[i]),
                    expected_input_tokens=int(inputs[i]),
                    expected_output_tokens=17,
                    prompt_tokens=-1 if failed else int(inputs[i]),
                    completion_tokens=-1 if failed else 17,
                )
            )


def cached(workdir: Path, n: int, seed: int, label: str) -> Path:
    path = workdir / f"bench-{n}-{seed}.rpr"
    if not path.exists():
        start = now_ns()
        write_results(path.with_suffix(".tmp"), n, seed, label)
        path.with_suffix(".tmp").rename(path)
        print(f"  (wrote {path} in {(now_ns() - start) / 1e9:.1f} s; cached for later runs)")
    return path


def timed_report(paths: list[Path]) -> dict[str, float]:
    stages: dict[str, float] = {}
    t0 = now_ns()
    runs = load_runs(paths)
    t1 = now_ns()
    doc = build_document(runs, slos=parse_slo("ttft<=200ms,tpot<=30ms,e2e:p99<=2s"), slo_spec="bench")
    t2 = now_ns()
    text = render_text(doc)
    t3 = now_ns()
    json_text = render_json(doc)
    t4 = now_ns()
    stages.update(
        load_and_measure=(t1 - t0) / 1e9,
        document=(t2 - t1) / 1e9,
        text=(t3 - t2) / 1e9,
        json=(t4 - t3) / 1e9,
        total=(t4 - t0) / 1e9,
    )
    assert text and json_text
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--workdir", default="/tmp/replayproxy-bench")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    n = args.requests
    one = cached(workdir, n, 1, "one")
    halves = [cached(workdir, n // 2, 2, "A"), cached(workdir, n // 2, 3, "B")]
    for name, paths in (
        (f"one run of {n:,}", [one]),
        (f"two runs of {n // 2:,} (+ paired comparison)", halves),
    ):
        stages = timed_report(paths)
        breakdown = ", ".join(f"{k} {v:.2f} s" for k, v in stages.items() if k != "total")
        verdict = "OK" if stages["total"] <= 10.0 else "OVER BUDGET"
        print(
            f"{name}: {stages['total']:.2f} s on one core (budget 10 s: {verdict}; "
            f"{stages['total'] / 10.0:.2f}x of budget) [{breakdown}]"
        )


if __name__ == "__main__":
    main()
