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

from replayproxy.report import contracts
from replayproxy.report.document_types import CachedShareDoc, PrefixCacheDoc
from replayproxy.report.runs import Run
from replayproxy.report.stats import summarize


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


def cached_shares(run: Run) -> np.ndarray:
    """Per request: cached / prompt tokens as its reply reported them; NaN when failed or unknown."""
    req, m = run.measures.requests, run.measures
    if len(req.cached_tokens) != len(req):
        return np.full(len(req), np.nan)
    known = m.ok & (req.cached_tokens >= 0) & (req.input_tokens > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(known, req.cached_tokens / np.maximum(req.input_tokens, 1), np.nan)


def cached_share_doc(run: Run, baseline: Run | None) -> CachedShareDoc | None:
    """Cached-token share per call, beside the share the same call had as recorded (paired by its
    trace position); None when no call of the run reported cached tokens."""
    share = cached_shares(run)
    if not np.isfinite(share).any():
        return None
    recorded = difference = None
    if baseline is not None and baseline is not run:
        base = cached_shares(baseline)
        index = run.measures.requests.index
        paired = np.full(len(share), np.nan)
        inside = (index >= 0) & (index < len(base))
        paired[inside] = base[index[inside]]
        both = np.isfinite(share) & np.isfinite(paired)
        recorded = summarize(paired[both]).to_dict()
        difference = summarize(share[both] - paired[both]).to_dict()
    return {"per_call": summarize(share).to_dict(), "recorded": recorded, "difference": difference}


# llama-server (build 11434) keeps a host-memory prompt cache (--cache-ram, 8 GiB by default) that
# the slot erase leaves: evicted prompts come back from it.
WARM_AFTER_ERASE = (
    "llama-server's host-memory prompt cache outlives the slot erase: start it with --cache-ram 0"
)


def first_cached(run: Run) -> int:
    """Cached tokens the engine said it served the run's first request (nothing ran before it in
    the run, so any came from before it); 0 when unknown."""
    req = run.measures.requests
    if not len(req) or len(req.cached_tokens) != len(req):
        return 0
    return max(int(req.cached_tokens[int(np.argmin(req.sent_ns))]), 0)


def header_notes(runs: list[Run]) -> list[str]:
    """What the run headers say about the cache at each run's start: a reset that failed, a reset
    after which the first request still found cached tokens (not a cold start), and a run of a
    trace the same engine already served without a reset in between (cache-warm)."""
    notes: list[str] = []
    served: set[tuple[str, str]] = set()
    for run in sorted(runs, key=lambda r: min((h.start_wall_ns for h in r.headers), default=0)):
        if run.kind != "replay" or not run.headers:
            continue
        header = run.headers[0]
        action, outcome = next(
            ((k, str(v)) for k, v in header.pre_run.items() if k in contracts.RESET_ACTIONS), ("", "")
        )
        reset = outcome == "ok"
        if outcome.startswith("failed"):
            notes.append(f"{run.label}: prefix cache not reset ({contracts.reset_failure(action, outcome)})")
        warm_tokens = first_cached(run) if reset else 0
        if warm_tokens:
            why = f": {WARM_AFTER_ERASE}" if action == "erase_slots" else ""
            notes.append(
                f"{run.label}: not a cold start: after the {action} its first request was served "
                f"{warm_tokens:,} cached tokens{why}"
            )
        key = (run.trace_digest, run.target)
        if key in served and not reset:
            notes.append(
                f"{run.label}: cache-warm: an earlier run sent this trace to this engine and the cache "
                "was not reset since"
            )
        served.add(key)
    return notes
