"""Fit before launch: what cannot hold the trace is pruned with its reason, doubtful ones flagged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replayproxy.cli import main
from replayproxy.tune.candidates import Config, parse_candidates
from replayproxy.tune.fit import TraceFacts, check_fit, trace_facts

FACTS = TraceFacts(requests=100, span_s=10.0, longest_tokens=3000, mean_tokens=1000.0)


def _config(knobs: dict[str, Any], **engine: Any) -> Config:
    command = "serve --port {port} " + " ".join(f"--{k} {{{k}}}" for k in knobs)
    (e,) = parse_candidates(
        {"engine": [{"name": "e", "command": command, "grid": {k: [v] for k, v in knobs.items()}, **engine}]},
        "c",
    )
    (config,) = e.configurations()
    return config


@pytest.mark.parametrize(
    ("knobs", "reason"),
    [
        ({"max_model_len": 2048}, "max_model_len 2048 is below the trace's longest request (3000 tokens)"),
        (
            {"max_num_seqs": 256, "max_num_batched_tokens": 128},
            "max_num_batched_tokens 128 is below max_num_seqs 256",
        ),
        (
            {"num_gpu_blocks": 100},
            "the KV cache holds 1600 tokens, less than the trace's longest request (3000)",
        ),
        ({"num_gpu_blocks": 100, "block_size": 16, "max_model_len": 4096}, "holds 1600 tokens"),
    ],
)
def test_what_cannot_hold_the_trace_is_pruned(knobs: dict[str, Any], reason: str) -> None:
    fit = check_fit(_config(knobs), FACTS)
    assert reason in fit.pruned


def test_a_cache_too_small_for_full_concurrency_is_flagged_not_pruned() -> None:
    fit = check_fit(_config({"num_gpu_blocks": 1000, "max_num_seqs": 64}), FACTS)
    assert not fit.pruned
    assert fit.flags == (
        "64 sequences of the trace's mean length need 64000 KV tokens, the cache holds 16000: "
        "preemption likely at full concurrency",
    )
    assert check_fit(_config({"num_gpu_blocks": 1000, "max_num_seqs": 8}), FACTS) == check_fit(
        _config({}), FACTS
    )


def test_the_capacity_calculator_gives_the_kv_cache_of_a_real_model() -> None:
    capacity = {"model": "llama-3.1-8b", "gpu_memory": "24GiB"}
    half = check_fit(_config({"gpu_memory_utilization": 0.5}, capacity=capacity), FACTS)
    assert "the weights need 15.0 GiB per GPU, more than the 12.0 GiB" in half.pruned
    low = check_fit(_config({"gpu_memory_utilization": 0.8, "max_num_seqs": 256}, capacity=capacity), FACTS)
    assert not low.pruned and "preemption likely" in low.flags[0]  # 256 x 1000 tokens do not fit
    high = check_fit(_config({"gpu_memory_utilization": 0.95, "max_num_seqs": 4}, capacity=capacity), FACTS)
    assert not high.pruned and not high.flags


def test_trace_facts_read_the_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.rpt"
    argv = ["synth", "-o", str(path), "--requests", "50", "--rate", "10", "--input-len", "fixed:300"]
    assert main([*argv, "--output-len", "fixed:20", "--seed", "1"]) == 0
    facts = trace_facts([path])
    assert facts.requests == 50
    assert facts.longest_tokens == 320 and facts.mean_tokens == 320
    assert 3.0 < facts.span_s < 8.0 and facts.rate == pytest.approx(50 / facts.span_s)


def test_sglang_spellings_of_the_knobs_are_understood() -> None:
    fit = check_fit(_config({"context_length": 2048}), FACTS)
    assert "max_model_len 2048 is below" in fit.pruned
    fit = check_fit(_config({"max_running_requests": 64, "chunked_prefill_size": 32}), FACTS)
    assert "max_num_batched_tokens 32 is below max_num_seqs 64" in fit.pruned
