"""The Mooncake readers of the consuming tools, reduced to the rules they enforce on a file.

Each function returns the problems that tool would report (or silently suffer) for these rows.
Sources read (see docs/formats.md for commits):
- AIPerf: src/aiperf/dataset/loader/mooncake_trace.py + models.py (MooncakeTrace: int lengths,
  int | float timestamp),
  src/aiperf/dataset/generator/prompt.py `_build_token_sequence` (final block in (0, block]; a
  hash id's tokens are cached at the size first seen — PR #1208: "A hash_id must map to a single
  fixed block size").
- guidellm: src/guidellm/data/deserializers/trace_mooncake.py `_validate_row`.
- vLLM: `vllm bench serve --dataset-name timed_trace` (PR #39795): each id expands to
  --timed-trace-chunk-hash-size tokens, so ids * size must cover input_length.
- SGLang: python/sglang/benchmark/datasets/mooncake.py: json.loads per line, the first
  --num-prompts lines, sorted by timestamp, timestamps in ms; the prompt is built from hash_ids
  alone (`f"{hash_id}" + " ".join(["hi"] * 128)` per id, then a fixed question), input_length unused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def read_rows(path: Path) -> list[dict[str, Any]]:
    """As SGLang does: one json.loads per non-blank line."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def aiperf_problems(rows: list[dict[str, Any]], block: int) -> list[str]:
    problems: list[str] = []
    sizes: dict[int, int] = {}
    for i, row in enumerate(rows):
        for name in ("input_length", "output_length"):
            if name in row and type(row[name]) is not int:
                problems.append(f"row {i}: {name} is not an int")
        if type(row.get("timestamp", 0)) not in (int, float):  # MooncakeTrace: int | float ms
            problems.append(f"row {i}: timestamp is not a number")
        ids = row.get("hash_ids", [])
        if any(type(h) is not int for h in ids):
            problems.append(f"row {i}: hash id not an int")
            continue
        if not ids:
            continue
        final = row["input_length"] - (len(ids) - 1) * block
        if not 0 < final <= block:
            problems.append(f"row {i}: final block size {final} not in (0, {block}]")
        for j, h in enumerate(ids):
            size = final if j == len(ids) - 1 else block
            if sizes.setdefault(h, size) != size:
                problems.append(
                    f"row {i}: hash_id {h} requested at {size} tokens, materialized at {sizes[h]}"
                )
    stamps = [r["timestamp"] for r in rows if "timestamp" in r]
    if stamps != sorted(stamps):
        problems.append("timestamps not sorted")
    return problems


def guidellm_problems(rows: list[dict[str, Any]], block: int) -> list[str]:
    problems: list[str] = []
    for i, row in enumerate(rows):
        n_in, n_out, ids = row["input_length"], row["output_length"], row["hash_ids"]
        if n_in < 0 or n_out < 0:
            problems.append(f"row {i}: negative token count")
        if any(h < 0 for h in ids):
            problems.append(f"row {i}: negative hash id")
        if math.ceil(n_in / block) != len(ids):
            problems.append(f"row {i}: {n_in} tokens at block {block} != {len(ids)} blocks")
    return problems


def vllm_timed_trace_problems(rows: list[dict[str, Any]], chunk: int) -> list[str]:
    return [
        f"row {i}: {len(r['hash_ids'])} ids x {chunk} < input_length {r['input_length']}"
        for i, r in enumerate(rows)
        if len(r["hash_ids"]) * chunk < r["input_length"]
    ]


def sglang_problems(rows: list[dict[str, Any]]) -> list[str]:
    return [
        f"row {i}: no {k}" for i, r in enumerate(rows) for k in ("timestamp", "output_length") if k not in r
    ]


def all_problems(path: Path, block: int) -> list[str]:
    rows = read_rows(path)
    return (
        aiperf_problems(rows, block)
        + guidellm_problems(rows, block)
        + vllm_timed_trace_problems(rows, block)
        + sglang_problems(rows)
    )


SGLANG_CHUNK = 128


def sglang_requests(rows: list[dict[str, Any]], num_prompts: int) -> list[tuple[float, str, int]]:
    """(arrival s, user message, output length) per request, as SGLang's Mooncake reader builds
    them with --mooncake-num-rounds 1 (before its chat template)."""
    chosen = sorted(rows[:num_prompts], key=lambda r: r["timestamp"])
    first = chosen[0]["timestamp"] if chosen else 0
    requests = []
    for record in chosen:
        query = "".join(f"{h}" + " ".join(["hi"] * SGLANG_CHUNK) for h in record.get("hash_ids", []))
        query += "Tell me a story based on this context."
        arrival = (record["timestamp"] - first) / 1000.0
        requests.append((arrival, f"Round 1: {query}", record.get("output_length", 256)))
    return requests
