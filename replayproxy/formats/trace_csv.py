"""Azure and BurstGPT CSV exports: the two public request-level CSV layouts, written a chunk at a time.

Readers: vLLM `bench serve --dataset-name burstgpt` (pandas; keeps rows whose Model is "GPT-4"
and whose Response tokens > 0, samples them and paces by --request-rate), AIPerf
`--custom-dataset-type burst_gpt_trace` (Timestamp in seconds, Request/Response tokens), and the
simulators that read Azure's `TIMESTAMP,ContextTokens,GeneratedTokens` (Splitwise, Vidur).
Neither layout has prefix information: sharing is not exported.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from replayproxy.formats.exporting import ExportOptions, ExportResult, output_lengths
from replayproxy.trace import Columns

ROWS_PER_CHUNK = 1 << 16
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write_burstgpt(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    """BurstGPT rows; Model is "GPT-4" (vLLM's reader keeps only those), seconds from the first request."""
    seconds = _relative_s(cols)
    inputs = np.maximum(cols.input_tokens, 0)
    outputs = output_lengths(cols)[0]
    with open(path, "w", encoding="utf-8", newline="") as out:
        out.write(BURSTGPT_HEADER)
        for rows in _chunks(len(cols)):
            n_in, n_out = inputs[rows].tolist(), outputs[rows].tolist()
            out.writelines(
                f"{t:.6f},GPT-4,{a},{b},{a + b},Conversation log\n"
                for t, a, b in zip(seconds[rows].tolist(), n_in, n_out, strict=True)
            )
    notes = [
        f"vLLM:     vllm bench serve --backend openai --endpoint /v1/completions --base-url {options.url} "
        f"--model {options.model} --dataset-name burstgpt --dataset-path {path} --num-prompts {len(cols)} "
        "--ignore-eos  (lengths only: vLLM samples the rows and paces them by --request-rate)",
        f"AIPerf:   aiperf profile --model {options.model} --url {options.url} --endpoint-type chat "
        f"--streaming --input-file {path} --custom-dataset-type burst_gpt_trace --fixed-schedule "
        "--extra-inputs ignore_eos:true",
    ]
    models = sorted({str(m) for m in cols.model if m})
    if models and models != ["GPT-4"]:
        notes.append(
            f"note: Model is written as GPT-4 on every row (vLLM reads no other); the trace has {models}"
        )
    return ExportResult(len(cols), notes)


def write_azure(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    """Azure 2023 rows: UTC date-times with 7 fractional digits (the trace's own start, when known)."""
    start = min((h.start_wall_ns for h in cols.headers), default=0)
    offsets = cols.offset_ns.astype(np.int64)
    first = int(offsets[0]) if len(offsets) else 0
    inputs = np.maximum(cols.input_tokens, 0)
    outputs = output_lengths(cols)[0]
    with open(path, "w", encoding="utf-8", newline="") as out:
        out.write(AZURE_HEADER)
        for rows in _chunks(len(cols)):
            stamps = np.datetime_as_string(
                (start + offsets[rows] - first).astype("datetime64[ns]"), unit="ns"
            )
            out.writelines(
                f"{t[:10]} {t[11:27]},{a},{b}\n"
                for t, a, b in zip(
                    stamps.tolist(), inputs[rows].tolist(), outputs[rows].tolist(), strict=True
                )
            )
    notes = [f"replayproxy import {path} --format azure -o TRACE.rpt"]
    if not start:
        notes.append("note: the traces carry no wall-clock start; times begin at 1970-01-01 00:00:00 UTC")
    return ExportResult(len(cols), notes)


def _relative_s(cols: Columns) -> np.ndarray:
    offsets = cols.offset_ns.astype(np.int64)
    return (offsets - (int(offsets[0]) if len(offsets) else 0)) / 1e9


def _chunks(n: int) -> list[slice]:
    return [slice(i, i + ROWS_PER_CHUNK) for i in range(0, n, ROWS_PER_CHUNK)]
