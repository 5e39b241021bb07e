"""Prefix caching in the report: implied hits at the engine's block size, the engine's, and header notes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from replayproxy.report import cache
from replayproxy.report.runs import load_runs
from replayproxy.results import ReplayResult, ResultWriter, RunHeader


def write_run(
    path: Path,
    reset: str,
    start_ns: int,
    hits: tuple[int, int] = (100, 356),
    action: str = "reset_prefix_cache",
    first_cached: int = 0,
) -> Path:
    header = RunHeader(
        label=path.stem,
        target="http://e",
        start_wall_ns=start_ns,
        trace_digest="abc",
        flavor="llamacpp" if action == "erase_slots" else "vllm",
        pre_run={action: reset},
    )
    with ResultWriter(path, header) as writer:
        for i, shared in enumerate((0, 300, 129, 64)):
            writer.write(
                ReplayResult(
                    index=i,
                    scheduled_ns=i,
                    sent_ns=i,
                    e2e_ns=10,
                    status=200,
                    expected_input_tokens=300,
                    prompt_tokens=300,
                    completion_tokens=1,
                    expected_output_tokens=1,
                    expected_shared_tokens=shared,
                    cached_tokens=first_cached if i == 0 else 128,
                )  # fmt: skip
            )
        before = {"block_size": 128, "prefix_hits": hits[0], "prefix_queries": 0}
        after = {"block_size": 128, "prefix_hits": hits[1], "prefix_queries": 1200}
        writer.write_extra("prefix_cache", {"before": before, "after": after})
    return path


def test_implied_hits_count_whole_blocks_and_keep_the_last_token_computed() -> None:
    # 300 shared of 300: 299 usable -> 256; 129 -> 128; 64 -> 0
    assert cache.implied_hits(np.array([0, 300, 129, 64]), np.array([300] * 4), 128) == 384


def test_the_report_sets_implied_beside_engine_hits(tmp_path: Path) -> None:
    run = load_runs([write_run(tmp_path / "a.rpr", "ok", 1)])[0]
    doc = cache.prefix_cache_doc(run)
    assert doc is not None
    assert doc["engine_block_size"] == 128 and doc["implied_hit_tokens"] == 384
    assert doc["engine_hit_tokens"] == 256 and doc["engine_query_tokens"] == 1200
    assert doc["engine_over_implied"] == 256 / 384


def test_a_failed_reset_and_a_warm_cache_are_noted(tmp_path: Path) -> None:
    runs = load_runs(
        [write_run(tmp_path / "a.rpr", "ok", 1), write_run(tmp_path / "b.rpr", "failed: HTTP 404", 2)]
    )
    notes = cache.header_notes(runs)
    fix = (
        "prefix cache not reset (reset_prefix_cache failed: HTTP 404; start vLLM with VLLM_SERVER_DEV_MODE=1)"
    )
    assert any(n == f"b: {fix}" for n in notes), notes
    assert any("cache-warm" in n and n.startswith("b:") for n in notes)
    assert not any(n.startswith("a:") for n in notes)


def test_a_reset_after_which_the_first_request_still_found_cached_tokens_is_not_a_cold_start(
    tmp_path: Path,
) -> None:
    """llama-server's slot erase answers 200, yet its host-memory prompt cache (--cache-ram) serves
    the first request from before the run: the report says so, with the flag that fixes it."""
    runs = load_runs([
        write_run(tmp_path / "cold.rpr", "ok", 1, action="erase_slots"),
        write_run(tmp_path / "llama.rpr", "ok", 2, action="erase_slots", first_cached=384),
        write_run(tmp_path / "vllm.rpr", "ok", 3, first_cached=256),
    ])  # fmt: skip
    notes = [n for n in cache.header_notes(runs) if "cold start" in n]
    assert notes == [
        "llama: not a cold start: after the erase_slots its first request was served 384 cached tokens: "
        + cache.WARM_AFTER_ERASE,
        "vllm: not a cold start: after the reset_prefix_cache its first request was served 256 cached tokens",
    ]
    assert "--cache-ram 0" in cache.WARM_AFTER_ERASE
