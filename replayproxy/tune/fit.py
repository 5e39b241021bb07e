"""Fit before launch: configurations that cannot hold the trace are pruned, doubtful ones flagged.

A launch of a real engine costs minutes, so the cheap checks come first: a `max_model_len` below the
trace's longest request (those requests would fail), a KV cache smaller than one longest request, a
token budget below the sequence cap (vLLM refuses `max_num_batched_tokens < max_num_seqs`). The KV
cache is known from the sim's `num_gpu_blocks` knob, or from the capacity calculator when the engine
gives `capacity = { model, gpu_memory, ... }`; a cache that cannot hold `max_num_seqs` requests of
mean length is flagged (preemption likely at full concurrency), not pruned.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from replayproxy.capacity.loading import load_model, parse_memory_size
from replayproxy.capacity.memory import GIB, Plan, Setup, plan
from replayproxy.errors import BadInputFile
from replayproxy.trace import load
from replayproxy.tune.candidates import Config, Knob

DEFAULT_BLOCK_SIZE = 16  # vLLM's and the sim's default KV block size
# The same engine setting under vLLM's (and the sim's) knob name, then SGLang's.
SYNONYMS = {
    "max_model_len": ("max_model_len", "context_length"),
    "max_num_seqs": ("max_num_seqs", "max_running_requests"),
    "max_num_batched_tokens": ("max_num_batched_tokens", "chunked_prefill_size"),
    "gpu_memory_utilization": ("gpu_memory_utilization", "mem_fraction_static"),
    "kv_cache_dtype": ("kv_cache_dtype",),
    "num_gpu_blocks": ("num_gpu_blocks", "num_gpu_blocks_override"),
    "block_size": ("block_size", "page_size"),
}


@dataclass(frozen=True, slots=True)
class TraceFacts:
    """What the search and the fit check need to know about the trace."""

    requests: int
    span_s: float
    longest_tokens: int  # input + output of the longest request
    mean_tokens: float

    @property
    def rate(self) -> float:
        """The trace's mean request rate at speed 1 (req/s)."""
        return self.requests / self.span_s if self.span_s > 0 else float("nan")


@dataclass(frozen=True, slots=True)
class Fit:
    pruned: str  # why the configuration cannot hold the trace; "" = launch it
    flags: tuple[str, ...]  # doubts that do not stop a launch


def trace_facts(paths: Iterable[str | os.PathLike[str]]) -> TraceFacts:
    cols = load(list(paths))
    if not len(cols):
        raise BadInputFile("the trace holds no requests")
    tokens = np.maximum(cols.input_tokens, 0) + np.maximum(cols.output_tokens, 0)
    offsets = cols.offset_ns
    return TraceFacts(
        requests=len(cols),
        span_s=float(offsets[-1] - offsets[0]) / 1e9,
        longest_tokens=int(tokens.max()),
        mean_tokens=float(tokens.mean()),
    )


def check_fit(config: Config, facts: TraceFacts) -> Fit:
    knobs = _normalised(config.knobs)
    max_model_len = _int(knobs.get("max_model_len"))
    if max_model_len is not None and facts.longest_tokens > max_model_len:
        return Fit(
            f"max_model_len {max_model_len} is below the trace's longest request "
            f"({facts.longest_tokens} tokens): those requests would fail",
            (),
        )
    seqs, budget = _int(knobs.get("max_num_seqs")), _int(knobs.get("max_num_batched_tokens"))
    if seqs is not None and budget is not None and budget < seqs:
        return Fit(f"max_num_batched_tokens {budget} is below max_num_seqs {seqs} (vLLM refuses it)", ())
    memory = _memory_plan(knobs, config.engine.capacity)
    if memory is not None and not memory.weights_fit:
        return Fit(
            f"the weights need {memory.weights_per_gpu_bytes / GIB:.1f} GiB per GPU, more than the "
            f"{memory.budget_per_gpu_bytes / GIB:.1f} GiB this memory share allows",
            (),
        )
    kv_tokens = _kv_tokens(knobs, memory)
    if kv_tokens is None:
        return Fit("", ())
    if kv_tokens < facts.longest_tokens:
        return Fit(
            f"the KV cache holds {kv_tokens} tokens, less than the trace's longest request "
            f"({facts.longest_tokens})",
            (),
        )
    if seqs is not None and seqs * facts.mean_tokens > kv_tokens:
        return Fit(
            "",
            (
                f"{seqs} sequences of the trace's mean length need {seqs * facts.mean_tokens:.0f} KV tokens, "
                f"the cache holds {kv_tokens}: preemption likely at full concurrency",
            ),
        )
    return Fit("", ())


def _normalised(knobs: Mapping[str, Knob]) -> dict[str, Knob]:
    """Knob values under vLLM's names, whichever engine's spelling the candidates file used."""
    found: dict[str, Knob] = {}
    for name, spellings in SYNONYMS.items():
        for spelling in spellings:
            if spelling in knobs:
                found[name] = knobs[spelling]
                break
    return found


def _kv_tokens(knobs: Mapping[str, Knob], memory: Plan | None) -> int | None:
    blocks = _int(knobs.get("num_gpu_blocks"))
    if blocks is not None:
        return blocks * (_int(knobs.get("block_size")) or DEFAULT_BLOCK_SIZE)
    return memory.kv_tokens if memory is not None else None


def _memory_plan(knobs: Mapping[str, Knob], capacity: Mapping[str, Any]) -> Plan | None:
    """The capacity calculator's split of GPU memory, when the engine says which model and GPU."""
    if not capacity:
        return None
    block_size = _int(knobs.get("block_size")) or DEFAULT_BLOCK_SIZE
    spec, _ = load_model(str(capacity["model"]))
    setup = Setup(
        gpu_memory_bytes=parse_memory_size(str(capacity["gpu_memory"])),
        gpus=int(capacity.get("gpus", capacity.get("tp", 1))),
        tp=int(capacity.get("tp", 1)),
        weight_dtype=str(capacity.get("weight_dtype", "")),
        kv_dtype=str(knobs.get("kv_cache_dtype", capacity.get("kv_dtype", "auto"))),
        util=float(knobs.get("gpu_memory_utilization", 0.9)),
        block_size=block_size,
        max_num_batched_tokens=_int(knobs.get("max_num_batched_tokens")) or 8192,
        max_num_seqs=_int(knobs.get("max_num_seqs")) or 256,
    )
    return plan(spec, setup)


def _int(value: Knob | None) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return int(value)
    except ValueError:
        return None
