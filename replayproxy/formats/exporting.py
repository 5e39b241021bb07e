"""What every exporter shares: the options the user states and the notes printed next to the file."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from replayproxy.trace import Columns

# The replayer's prompt synthesis, injected by the export command (formats may not import replay):
# the prompt text of every request, in arrival order, as the replayer would send it.
PromptsOf = Callable[[Columns], list[str]]


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """Choices from the command line; None means the format's documented default."""

    block_size: int | None = None  # tokens per consumer hash id
    sessions: bool = False  # add session_id / delay (AIPerf, GenAI-Perf multi-turn)
    model: str = "MODEL"  # shown in the printed consumer command lines
    url: str = "http://localhost:8000"
    inspect: dict[str, object] | None = None  # `inspect --json` figures, for the profile
    prompts: PromptsOf | None = None  # the replayer's prompt synthesis, for vllm-custom


@dataclass(slots=True)
class ExportResult:
    """Rows written and lines for the user (consumer command lines, caveats)."""

    rows: int
    notes: list[str] = field(default_factory=list)


def write_json_lines(path: Path, rows: Iterable[dict[str, object]]) -> int:
    """One compact JSON object per line (orjson), newline-terminated; returns the count."""
    count = 0
    dumps = orjson.dumps
    with open(path, "wb") as out:
        for row in rows:
            out.write(dumps(row) + b"\n")
            count += 1
    return count


def relative_ms(cols: Columns) -> np.ndarray:
    """Arrival in integer milliseconds from the first request (what trace-replay consumers expect)."""
    offsets = cols.offset_ns.astype(np.int64)
    base = int(offsets[0]) if len(offsets) else 0
    return np.asarray(np.rint((offsets - base) / 1e6), np.int64)


def output_lengths(cols: Columns) -> tuple[np.ndarray, int]:
    """Recorded output tokens, else max_tokens, else 1; also how many rows needed a fallback."""
    out = cols.output_tokens.astype(np.int64)
    fallback = np.where(cols.max_tokens > 0, cols.max_tokens, 1)
    missing = out < 0
    return np.where(missing, fallback, out), int(missing.sum())


def session_labels(cols: Columns) -> list[str | None]:
    """Sessions as short labels in first-seen order ("s0", "s1", ...): keyed hashes never leave."""
    names: dict[int, str] = {}
    return [names.setdefault(s, f"s{len(names)}") if s else None for s in cols.session.tolist()]


def aiperf_command(path: Path, dataset_type: str, block: int, options: ExportOptions) -> str:
    """AIPerf trace replay (docs: benchmark-modes/trace-replay; --isl-block-size sets the id size)."""
    args = [
        f"aiperf profile --model {options.model} --url {options.url} --endpoint-type chat --streaming",
        f"--input-file {path} --custom-dataset-type {dataset_type} --isl-block-size {block} --fixed-schedule",
    ]
    return "AIPerf:   " + " ".join(args)


def vllm_timed_trace_command(
    path: Path, rows: int, block: int, seconds_per_unit: float, options: ExportOptions
) -> str:
    """vLLM `timed_trace` (PR #39795): ids expand to the chunk size; timestamps times the multiplier."""
    args = [
        f"vllm bench serve --backend openai-chat --endpoint /v1/chat/completions --base-url {options.url}",
        f"--model {options.model} --dataset-name timed_trace --dataset-path {path} --num-prompts {rows}",
        f"--timed-trace-chunk-hash-size {block} --timed-trace-sec-multiplier {seconds_per_unit:g}",
        "--self-timed --disable-shuffle --ignore-eos",
    ]
    return "vLLM:     " + " ".join(args)
