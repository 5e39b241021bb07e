"""Result files -> runs: shards of one run merged into one column, labels made unique.

A run's label is the `--label` given at replay time, else "target model". Shards of a sharded
replay (RunHeader.shard "i/N", same label, target and trace digest) become one run; their send
times are put on one time line through each shard's start wall time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replayproxy.report import telemetry
from replayproxy.report.measures import Measures, Requests, measure
from replayproxy.results import ResultFile, RunHeader, load_results


@dataclass(slots=True)
class Run:
    """One column of the report: a replay run (maybe merged from shards) or the production baseline."""

    label: str
    kind: str  # "replay" | "baseline"
    measures: Measures
    paths: tuple[str, ...] = ()
    target: str = ""
    model: str = ""
    trace_digest: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    token_timing: str = "chunk"
    shards: int = 1
    headers: tuple[RunHeader, ...] = ()
    extras: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # side records, e.g. telemetry

    @property
    def speed(self) -> float | None:
        value = self.options.get("speed")
        return float(value) if isinstance(value, int | float) else None


def model_of(header: RunHeader) -> str:
    """The model the run asked for: the --model option, else the first id in the /v1/models answer."""
    model = header.options.get("model")
    if isinstance(model, str) and model:
        return model
    models = header.models
    if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
        first = models["data"][0]
        if isinstance(first, dict) and isinstance(first.get("id"), str):
            return str(first["id"])
    return ""


def load_runs(paths: Iterable[str | os.PathLike[str]]) -> list[Run]:
    """Load result files, merge shards, and return one Run per replay run in file-name order."""
    groups: dict[tuple[Any, ...], list[ResultFile]] = {}
    for f in load_results(paths):
        h = f.header
        key: tuple[Any, ...] = (str(f.path),)
        if h.shard:
            key = ("shard", h.label, h.target, h.trace_digest, h.shard.partition("/")[2])
        groups.setdefault(key, []).append(f)
    runs = [_run(files) for files in groups.values()]
    _unique_labels(runs)
    return runs


def _run(files: list[ResultFile]) -> Run:
    seen: dict[str, str] = {}
    for f in files:
        if f.header.shard in seen:
            raise ValueError(
                f"{f.path} and {seen[f.header.shard]} are both shard {f.header.shard} of one run; "
                "pass one run's shard files at a time"
            )
        seen[f.header.shard] = str(f.path)
    header = files[0].header
    model = model_of(header)
    extras: dict[str, list[dict[str, Any]]] = {}
    for f in files:
        for kind, records in f.extras.items():
            if kind == "telemetry":
                records = [r for r in records if telemetry.well_formed(r)]
            extras.setdefault(kind, []).extend(records)
    return Run(
        label=header.label or " ".join(p for p in (header.target, model) if p),
        kind="replay",
        measures=measure(_requests(files)),
        paths=tuple(str(f.path) for f in files),
        target=header.target,
        model=model,
        trace_digest=header.trace_digest,
        options=dict(header.options),
        token_timing=header.token_timing,
        shards=len(files),
        headers=tuple(f.header for f in files),
        extras=extras,
    )


def _requests(files: list[ResultFile]) -> Requests:
    base_ns = min(f.header.start_wall_ns for f in files)

    def col(name: str) -> np.ndarray:
        return np.concatenate([f.column(name) for f in files])

    def shifted(name: str) -> np.ndarray:
        parts = []
        for f in files:
            values = f.column(name)
            parts.append(np.where(values >= 0, values + (f.header.start_wall_ns - base_ns), values))
        return np.concatenate(parts)

    def ragged(name: str) -> tuple[np.ndarray, np.ndarray]:
        flat = np.concatenate([f.table.ragged[name][0] for f in files])
        lengths = np.concatenate([f.table.ragged[name][1] for f in files])
        return flat, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    gaps, gap_index = ragged("chunk_gaps_us")
    tokens, token_index = ragged("chunk_tokens")
    prompt = col("prompt_tokens")
    expected_input = col("expected_input_tokens")
    return Requests(
        index=col("index"),
        scheduled_ns=shifted("scheduled_ns"),
        sent_ns=shifted("sent_ns"),
        endpoint=col("endpoint"),
        stream=col("stream"),
        error=col("error"),
        ttft_ns=col("ttft_ns"),
        e2e_ns=col("e2e_ns"),
        gaps_us=gaps,
        gap_index=gap_index,
        chunk_tokens=tokens,
        token_index=token_index,
        content_chunks=col("content_chunks"),
        input_tokens=np.where(prompt >= 0, prompt, expected_input),
        output_tokens=col("completion_tokens"),
        expected_input_tokens=expected_input,
        expected_output_tokens=col("expected_output_tokens"),
        expected_shared_tokens=col("expected_shared_tokens")
        if all("expected_shared_tokens" in f.table.columns for f in files)
        else np.zeros(0, np.int64),
    )


def _unique_labels(runs: list[Run]) -> None:
    """Equal labels get the run's speed (sweep steps) or a counter appended."""
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.label] = counts.get(run.label, 0) + 1
    seen: dict[str, int] = {}
    for run in runs:
        if counts[run.label] == 1:
            continue
        seen[run.label] = seen.get(run.label, 0) + 1
        suffix = f"@{run.speed:g}x" if run.speed is not None else f"#{seen[run.label]}"
        run.label = f"{run.label} {suffix}"
    if len({r.label for r in runs}) != len(runs):  # same speed twice: fall back to counters
        for i, run in enumerate(runs, 1):
            run.label = f"{run.label} #{i}"
