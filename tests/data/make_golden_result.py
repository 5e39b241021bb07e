"""Writes tests/data/result-v<N>-golden.rpr, the version-N result file every later reader must keep loading.

Run once per result format version (`python tests/data/make_golden_result.py 1`) and commit the
output; never regenerate an existing version's file, since its bytes are the point of the test.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from replayproxy.results import ReplayResult, ResultWriter, RunHeader

START_WALL_NS = 1_700_000_000_000_000_000
FRAME_RECORDS = 2  # two batches, so the reader joins frames


def golden_path(version: int) -> Path:
    return Path(__file__).parent / f"result-v{version}-golden.rpr"


def golden_header() -> RunHeader:
    return RunHeader(
        label="vllm@golden",
        target="http://127.0.0.1:8000",
        start_wall_ns=START_WALL_NS,
        trace_paths=("traces/prod.rpt",),
        trace_digest="ab" * 32,
        flavor="vllm",
        models={"object": "list", "data": [{"id": "llama-3-8b", "max_model_len": 8192}]},
        engine_version="0.6.3",
        options={"speed": 2.0, "seed": 7, "traces": ["traces/prod.rpt"]},
        pre_run={"reset_prefix_cache": "ok"},
        replayproxy_version="golden",
        host="bench-1",
        token_timing="token",
        shard="0/2",
        repetition=2,
        repetitions=3,
        warmup={"requests": 4},
        contract={"engine_args": "--max-num-seqs 64", "note": "golden"},
    )


def golden_results() -> list[ReplayResult]:
    return [
        ReplayResult(
            index=0, scheduled_ns=0, sent_ns=120_000, endpoint="chat", stream=True, headers_ns=9_000_000,
            ttft_ns=15_000_000, e2e_ns=95_000_000, chunk_gaps_us=(20_000, 2**32 - 1), chunk_tokens=(1, 2, 3),
            content_chunks=3, status=200, expected_input_tokens=1200, expected_output_tokens=6,
            prompt_tokens=1201, completion_tokens=6, cached_tokens=1024, expected_shared_tokens=1024,
            new_connection=True, worker=1, session=0xFEEDFACECAFEBEEF, turn=0,
        ),
        ReplayResult(
            index=2, scheduled_ns=500_000_000, sent_ns=500_300_000, endpoint="completions", stream=False,
            headers_ns=40_000_000, ttft_ns=41_000_000, e2e_ns=41_000_000, content_chunks=1, status=200,
            expected_input_tokens=40, expected_output_tokens=10, prompt_tokens=40, completion_tokens=10,
        ),
        ReplayResult(
            index=3, scheduled_ns=1_000_000_000, sent_ns=1_000_050_000, status=503, error="http_5xx",
            e2e_ns=3_000_000, error_message="Service Unavailable", session=0xFEEDFACECAFEBEEF, turn=1,
            after=0, think_ns=250_000_000,
        ),
    ]  # fmt: skip


EXTRAS: dict[str, dict[str, Any]] = {
    "trace_profile": {"requests": 3, "prefix_reuse": 0.25},
    "telemetry": {
        "source": "http://127.0.0.1:8000/metrics",
        "samples": [{"t_ns": 5, "kv_usage": 0.5}],
        "found": {},
    },
}
FOOTER: dict[str, Any] = {"summary": {"requests": 3, "errors": 1}}


def write_golden(path: Path) -> None:
    writer = ResultWriter(path, golden_header(), frame_records=FRAME_RECORDS)
    for result in golden_results():
        writer.write(result)
    for kind, record in EXTRAS.items():
        writer.write_extra(kind, record)
    writer.close(**FOOTER)


if __name__ == "__main__":
    out = golden_path(int(sys.argv[1]))
    out.unlink(missing_ok=True)
    write_golden(out)
    print(f"wrote {out} ({out.stat().st_size} bytes)")
