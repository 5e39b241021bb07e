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

from replayproxy.formats.exporting import ExportOptions, ExportResult, output_lengths, row_chunks
from replayproxy.trace import Columns

BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write_burstgpt(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    """BurstGPT rows; Model is "GPT-4" (vLLM's reader keeps only those), seconds from the first request."""
    origin = int(cols.offset_ns[0]) if len(cols) else 0
    with open(path, "w", encoding="utf-8", newline="") as out:
        out.write(BURSTGPT_HEADER)
        for rows in row_chunks(len(cols)):
            seconds = (cols.offset_ns[rows].astype(np.int64) - origin) / 1e9
            n_in = np.maximum(cols.input_tokens[rows], 0).tolist()
            n_out = output_lengths(cols, rows)[0].tolist()
            out.writelines(
                f"{t:.6f},GPT-4,{a},{b},{a + b},Conversation log\n"
                for t, a, b in zip(seconds.tolist(), n_in, n_out, strict=True)
            )
            cols.release(rows)
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
    first = int(cols.offset_ns[0]) if len(cols) else 0
    with open(path, "w", encoding="utf-8", newline="") as out:
        out.write(AZURE_HEADER)
        for rows in row_chunks(len(cols)):
            stamps = np.datetime_as_string(
                (start + cols.offset_ns[rows].astype(np.int64) - first).astype("datetime64[ns]"), unit="ns"
            )
            inputs = np.maximum(cols.input_tokens[rows], 0).tolist()
            out.writelines(
                f"{t[:10]} {t[11:27]},{a},{b}\n"
                for t, a, b in zip(
                    stamps.tolist(), inputs, output_lengths(cols, rows)[0].tolist(), strict=True
                )
            )
            cols.release(rows)
    notes = [f"replayproxy import {path} --format azure -o TRACE.rpt"]
    if not start:
        notes.append("note: the traces carry no wall-clock start; times begin at 1970-01-01 00:00:00 UTC")
    return ExportResult(len(cols), notes)
