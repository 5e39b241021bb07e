"""GPU samples beside a run: peak memory and mean utilization from the `--gpu-sampler` lines.

The replayer stores the sampler's CSV lines as they came (replay.gpu_sampler). nvidia-smi's
`--query-gpu=... --format=csv` prints a header naming the columns (`memory.used [MiB]`); with
`noheader` the columns are taken from the `--query-gpu=` list in the stored command. Values lose
their units ("1234 MiB", "56 %"); lines that do not parse are counted, not guessed at.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from replayproxy.report.document_types import GpuSamplesDoc

MEMORY = "memory.used"
UTILIZATION = "utilization.gpu"
INDEX = "index"
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")


def summarize(record: dict[str, Any]) -> GpuSamplesDoc:
    """{samples, unparsed, gpus, memory_used_peak_mib, utilization_mean_pct}; null where not sampled."""
    columns = _query_columns(str(record.get("command", "")))
    rows: list[list[str]] = []
    unparsed = 0
    for _, line in record.get("lines", []):
        fields = [f.strip() for f in str(line).split(",")]
        names = [f.split(" [")[0].strip().lower() for f in fields]
        if MEMORY in names or UTILIZATION in names:
            columns = names
            continue
        if columns is None or len(fields) != len(columns):
            unparsed += 1
            continue
        rows.append(fields)
    memory = _column(rows, columns, MEMORY)
    utilization = _column(rows, columns, UTILIZATION)
    index = _column(rows, columns, INDEX)
    return {
        "samples": len(rows),
        "unparsed": unparsed,
        "gpus": len(set(index[np.isfinite(index)].tolist())) if index is not None else None,
        "memory_used_peak_mib": _stat(memory, np.max),
        "utilization_mean_pct": _stat(utilization, np.mean),
        "command": record.get("command", ""),
    }


def _query_columns(command: str) -> list[str] | None:
    match = re.search(r"--query-gpu[= ](\S+)", command)
    return [c.strip().lower() for c in match.group(1).split(",")] if match else None


def _column(rows: list[list[str]], columns: list[str] | None, name: str) -> np.ndarray | None:
    if columns is None or name not in columns:
        return None
    position = columns.index(name)
    values = []
    for row in rows:
        found = _NUMBER.match(row[position])
        values.append(float(found.group(1)) if found else np.nan)
    return np.array(values, dtype=np.float64)


def _stat(values: np.ndarray | None, reduce: Callable[[np.ndarray], Any]) -> float | None:
    if values is None:
        return None
    known = values[np.isfinite(values)]
    return float(reduce(known)) if len(known) else None
