"""Prefix caching, proven: the hits the trace implies at the engine's block size beside the engine's own.

A request that shares S prompt tokens with an earlier one can be served `floor(min(S, N - 1) / B) * B`
of its N tokens from a prefix cache of B-token blocks (vLLM always computes the last token; the
trace's sharing assumes the earlier request's blocks are still cached). The engine's figure is
the increase of its prefix-cache hit counter over the run, read before and after it (other
traffic on the engine adds to it). Also the run-header notes on the cache's state at the start.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replayproxy.report.document_types import PrefixCacheDoc
from replayproxy.report.runs import Run

NOT_RESET_VLLM = "prefix cache not reset: start vLLM with VLLM_SERVER_DEV_MODE=1"


def implied_hits(shared: np.ndarray, inputs: np.ndarray, block: int) -> int:
    """Prompt tokens a B-token-block prefix cache would serve, summed over requests."""
    usable = np.minimum(shared, np.maximum(inputs - 1, 0))
    return int((np.maximum(usable, 0) // block * block).sum())


def _state(run: Run) -> tuple[dict[str, Any], dict[str, Any]]:
    records = run.extras.get("prefix_cache", [])
    record = records[0] if records else {}
    return dict(record.get("before") or {}), dict(record.get("after") or {})


def prefix_cache_doc(run: Run) -> PrefixCacheDoc | None:
    """Implied and engine-reported prefix-cache hits of one run; None when the run recorded neither."""
    before, after = _state(run)
    req = run.measures.requests
    shared = req.expected_shared_tokens
    block = after.get("block_size") or before.get("block_size")
    if not len(shared) and not before:
        return None
    ok = run.measures.ok if len(shared) == len(req) else np.zeros(0, bool)
    inputs = req.expected_input_tokens
    implied = implied_hits(shared[ok], inputs[ok], int(block)) if block and len(ok) else None
    engine = None
    if "prefix_hits" in before and "prefix_hits" in after:
        engine = int(after["prefix_hits"] - before["prefix_hits"])
    cached = (
        req.cached_tokens[run.measures.ok] if len(req.cached_tokens) == len(req) else np.zeros(0, np.int64)
    )
    reporting = cached[cached >= 0]
    queries = None
    if "prefix_queries" in before and "prefix_queries" in after:
        queries = int(after["prefix_queries"] - before["prefix_queries"])
    return {
        "engine_block_size": block,
        "implied_hit_tokens": implied,
        "engine_hit_tokens": engine,
        "engine_query_tokens": queries,
        "engine_over_implied": engine / implied if implied and engine is not None else None,
        "trace_shared_tokens": int(np.maximum(shared[ok], 0).sum()) if len(ok) else None,
        "reply_cached_tokens": int(reporting.sum()) if len(reporting) else None,
        "replies_reporting_cached": len(reporting),
    }


def header_notes(runs: list[Run]) -> list[str]:
    """What the run headers say about the cache at each run's start: a reset that failed, and a
    run of a trace the same engine already served without a reset in between (cache-warm)."""
    notes: list[str] = []
    served: set[tuple[str, str]] = set()
    for run in sorted(runs, key=lambda r: min((h.start_wall_ns for h in r.headers), default=0)):
        if run.kind != "replay" or not run.headers:
            continue
        header = run.headers[0]
        outcome = next(
            (str(v) for k, v in header.pre_run.items() if k in ("reset_prefix_cache", "flush_cache")), ""
        )
        reset = outcome == "ok"
        if outcome.startswith("failed"):
            hint = (
                NOT_RESET_VLLM if header.flavor == "vllm" and "404" in outcome else "prefix cache not reset"
            )
            notes.append(f"{run.label}: {hint} ({outcome})")
        key = (run.trace_digest, run.target)
        if key in served and not reset:
            notes.append(
                f"{run.label}: cache-warm: an earlier run sent this trace to this engine and the cache "
                "was not reset since"
            )
        served.add(key)
    return notes
