"""Trace builders for the format tests: prompts as token lists, hashed the way the proxy hashes them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.shape import RequestShape, prefix_block_hashes
from replayproxy.trace import TraceHeader, write_columns, write_trace

KEY = b"format-tests-key"
DATA = Path(__file__).resolve().parents[1] / "data" / "formats"
SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"


def tokens(*parts: tuple[str, int]) -> list[int]:
    """A prompt made of named runs: equal names give equal tokens, so prefixes are shared."""
    out: list[int] = []
    for name, count in parts:
        base = sum(map(ord, name)) * 100_003
        out.extend(base + i for i in range(count))
    return out


def shape(
    offset_ms: float, prompt: Sequence[int], output: int = 50, block: int = 16, **fields: Any
) -> RequestShape:
    """A served request whose prompt is `prompt`; `fields` override anything (e.g. input_tokens)."""
    values: dict[str, Any] = {
        "offset_ns": round(offset_ms * 1e6),
        "input_tokens": len(prompt),
        "output_tokens": output,
        "prefix_hashes": tuple(prefix_block_hashes(prompt, block, KEY)),
        "prefix_units": len(prompt),
        "status": 200,
    }
    return RequestShape(**(values | fields))


def write(path: Path, shapes: Sequence[RequestShape], block: int = 16, unit: str = "token") -> Path:
    header = TraceHeader(start_wall_ns=1_700_000_000_000_000_000, block_size=block, block_unit=unit)
    write_trace(path, header, shapes, mono_ns=lambda: 0, wall_ns=lambda: 0)
    return path


def conversation_trace(path: Path, block: int = 16) -> Path:
    """A small workload with a shared system prompt, a two-turn session and unrelated requests."""
    system = ("system", 1030)
    shapes = [
        shape(0, tokens(system, ("q1", 300)), 40, block, session=11, turn=0),
        shape(250, tokens(system, ("q2", 77)), 10, block),
        shape(
            900,
            tokens(system, ("q1", 300), ("a1", 40), ("q1b", 120)),
            60,
            block,
            session=11,
            turn=1,
            e2e_ns=400_000_000,
        ),
        shape(1500, tokens(("other", 5)), 7, block),
        shape(1500, tokens(("doc", 2048)), 300, block),
        shape(3001, tokens(("doc", 2048), ("ask", 600)), 20, block),
    ]
    return write(path, shapes, block)


def hashed_trace(path: Path, hashes: np.ndarray, per_request: int, inputs: np.ndarray, block: int) -> Path:
    """A served request per row of `inputs` tokens, each with the next `per_request` of `hashes`."""
    rows = len(inputs)
    rng = np.random.default_rng(0)
    columns = {
        "offset_ns": np.cumsum(rng.integers(1, 2_000_000, rows)),
        "input_tokens": inputs,
        "output_tokens": rng.integers(1, 500, rows),
        "status": 200,
        "prefix_hashes": (hashes, np.full(rows, per_request)),
        "prefix_units": inputs,
    }
    header = TraceHeader(start_wall_ns=0, source="test", block_size=block, block_unit="token")
    write_columns(path, header, columns, rows, wall_ns=lambda: 0)
    return path
