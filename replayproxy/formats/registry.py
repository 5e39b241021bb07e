"""The formats table: each name maps to its reader (import) and/or writer (export); `--help` lists it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from replayproxy.errors import BadOption
from replayproxy.formats import (
    agentic_mooncake,
    aiperf_dag,
    aiperf_single_turn,
    azure,
    bailian,
    burstgpt,
    copilot,
    csv_format,
    dynamo,
    jsonl,
    mooncake,
    parquet_format,
    profile_fit,
    servegen,
    trace_csv,
    tracelab,
    vllm_custom,
    weka,
)
from replayproxy.formats.exporting import ExportOptions, ExportResult
from replayproxy.formats.importing import Imported, ImportOptions
from replayproxy.trace import Columns

Reader = Callable[[Path, ImportOptions], Imported]
Writer = Callable[[Columns, Path, ExportOptions], ExportResult]


class Format(NamedTuple):
    help: str
    read: Reader | None = None
    write: Writer | None = None


FORMATS: dict[str, Format] = {
    "mooncake": Format(
        "Mooncake JSON lines: timestamp (ms), input/output_length, hash_ids", mooncake.read, mooncake.write
    ),
    "bailian": Format(
        "Qwen-Bailian JSON lines: chat_id, parent_chat_id, timestamp (s), 16-token hash_ids",
        bailian.read,
        bailian.write,
    ),
    "azure": Format(
        "Azure LLM inference CSV (2023/2024): TIMESTAMP,ContextTokens,GeneratedTokens",
        azure.read,
        trace_csv.write_azure,
    ),
    "burstgpt": Format(
        "BurstGPT CSV: Timestamp,[Session ID,Elapsed time,]Model,Request/Response tokens,...",
        burstgpt.read,
        trace_csv.write_burstgpt,
    ),
    "aiperf": Format(
        'AIPerf single-turn JSON lines {"text", "timestamp", "output_length"} (replayer prompts)',
        write=aiperf_single_turn.write,
    ),
    "aiperf-dag": Format(
        "AIPerf DAG JSON lines: session graphs as conversations with forks and spawns (replayer prompts)",
        write=aiperf_dag.write,
    ),
    "servegen": Format(
        "ServeGen client distributions (a model directory of chunk-<id>-trace.csv/-dataset.json), sampled",
        servegen.read,
    ),
    "tracelab": Format(
        "TraceLab agent traces: one JSON line per LLM round (sessions, tool waits, prefix split)",
        tracelab.read,
    ),
    "copilot": Format(
        "GitHub Copilot coding-agent sessions (JSON lines, .gz): turns[].llm_calls, tool_batches",
        copilot.read,
    ),
    "weka": Format(
        "WEKA agentic-coding traces (a JSON file or directory): requests, hash_ids, subagents",
        weka.read,
    ),
    "dynamo": Format(
        "Dynamo dynamo.request.trace.v1 request_end rows (JSON lines, .gz) with agent_context",
        dynamo.read,
    ),
    "agentic-mooncake": Format(
        "Dynamo agentic Mooncake rows: request_id, wait_for, delay, tool_wait_ms, hash_ids",
        agentic_mooncake.read,
    ),
    "jsonl": Format(
        "replayproxy's JSON-lines workload (hand-made workloads; docs/formats.md)", jsonl.read, jsonl.write
    ),
    "csv": Format("one row per request with every shape field", write=csv_format.write),
    "parquet": Format("like csv, as Parquet with list columns (needs pyarrow)", write=parquet_format.write),
    "profile": Format(
        "JSON workload profile with fitted distributions (input of synth --profile)", write=profile_fit.write
    ),
    "vllm-custom": Format(
        '{"prompt": ...} JSON lines for `vllm bench serve --dataset-name custom`', write=vllm_custom.write
    ),
}


def importers() -> dict[str, Format]:
    return {name: f for name, f in FORMATS.items() if f.read is not None}


def exporters() -> dict[str, Format]:
    return {name: f for name, f in FORMATS.items() if f.write is not None}


def reader(name: str) -> Reader:
    """The import format's reader; an unknown name is a one-line error listing the valid ones."""
    read = FORMATS[name].read if name in FORMATS else None
    if read is None:
        raise _unknown(name, importers())
    return read


def writer(name: str) -> Writer:
    """The export format's writer; an unknown name is a one-line error listing the valid ones."""
    write = FORMATS[name].write if name in FORMATS else None
    if write is None:
        raise _unknown(name, exporters())
    return write


def _unknown(name: str, formats: dict[str, Format]) -> BadOption:
    return BadOption(f"--format: invalid choice: {name!r} (choose from {', '.join(sorted(formats))})")


def listing(formats: dict[str, Format]) -> str:
    """The table as help text, one format per line."""
    width = max(map(len, formats))
    return "formats:\n" + "\n".join(f"  {name:<{width}}  {f.help}" for name, f in formats.items())
