"""Test traces written from RequestShapes (synthetic.generate for realistic ones)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from replayproxy import clock, synthetic
from replayproxy.shape import RequestShape
from replayproxy.trace import TraceHeader, write_trace

SIM_MODEL = "sim-llama-3.1-8b"


def write(
    path: Path,
    shapes: Iterable[RequestShape],
    *,
    block_size: int = 16,
    unit: str = "token",
    source: str = "synth",
) -> Path:
    header = TraceHeader(start_wall_ns=0, source=source, block_size=block_size, block_unit=unit)
    write_trace(path, header, shapes, mono_ns=clock.now_ns, wall_ns=clock.wall_ns)
    return path


def synthetic_shapes(**spec: Any) -> list[RequestShape]:
    """A realistic trace (prefix groups, multi-turn sessions) with the sim's model name."""
    values: dict[str, Any] = {"model": SIM_MODEL, "requests": 100, "rate_rps": 20.0, "seed": 1}
    values.update(spec)
    for name in ("input_len", "output_len", "turns"):
        if isinstance(values.get(name), str):
            values[name] = synthetic.LengthDist.parse(values[name])
    return list(synthetic.generate(synthetic.SynthSpec(**values)))


def write_synthetic(path: Path, **spec: Any) -> Path:
    return write(path, synthetic_shapes(**spec))


def rebased(shapes: Iterable[RequestShape], **changes: Any) -> list[RequestShape]:
    return [s._replace(**changes) for s in shapes]


def prefix_heavy(path: Path, endpoint: str, **spec: Any) -> Path:
    """Shared system prompts of `prefix_groups` groups; chat has 2-3-turn sessions too."""
    values: dict[str, Any] = {
        "prefix_groups": 3,
        "prefix_len_tokens": 400,
        "sessions_share": 0.4 if endpoint == "chat" else 0.0,
        "turns": "uniform:2,3",
        "input_len": "uniform:420,700",
        "output_len": "uniform:2,6",
        "endpoint": endpoint,
    }
    values.update(spec)
    return write(path, synthetic_shapes(**values))
