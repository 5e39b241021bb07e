"""The production baseline: the timings the proxy recorded in a trace, as a report column of their own.

Trace position i is the request a replay records as `ReplayResult.index == i` (both follow
`replayproxy.trace.load`'s arrival order), so the baseline pairs with replay runs like any run.
It has no schedule, so schedule lag and latency-from-schedule are left empty.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable

import numpy as np

from replayproxy.report.measures import Requests, measure
from replayproxy.report.runs import Run
from replayproxy.report.sessions import previous_turns
from replayproxy.trace import expand_paths, load, storage

BASELINE_LABEL = "baseline (production)"


def baseline_run(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> Run:
    """Load traces and turn their recorded timings into a Run."""
    cols = load(paths)
    n = len(cols)
    gap_lengths = np.diff(cols.chunk_index)
    ttft = cols.ttft_ns
    output = np.where(cols.output_estimated, -1, cols.output_tokens)
    requests = Requests(
        index=np.arange(n, dtype=np.int64),
        scheduled_ns=np.full(n, -1, np.int64),
        sent_ns=cols.offset_ns.astype(np.int64),
        endpoint=cols.endpoint,
        stream=cols.stream,
        error=cols.error,
        ttft_ns=ttft,
        e2e_ns=cols.e2e_ns,
        gaps_us=cols.chunk_gaps_us,
        gap_index=cols.chunk_index,
        chunk_tokens=np.zeros(0, np.uint32),
        token_index=np.zeros(n + 1, np.int64),
        content_chunks=np.where(ttft >= 0, gap_lengths + 1, 0),
        input_tokens=cols.input_tokens,
        output_tokens=output,
        expected_input_tokens=np.full(n, -1, np.int64),
        expected_output_tokens=np.full(n, -1, np.int64),
        session=cols.session,
        after=previous_turns(cols.session),
        think_ns=cols.think_ns,
        cached_tokens=cols.cached_tokens,
        turn=cols.turn.astype(np.int64),
    )
    upstreams = sorted({h.upstream for h in cols.headers if h.upstream})
    paths_list = [str(paths)] if isinstance(paths, str | os.PathLike) else [str(p) for p in paths]
    digest = hashlib.sha256()  # as the replayer computes RunHeader.trace_digest, so runs of it pair
    for path in expand_paths(paths_list):
        with storage.opened(path) as data:
            digest.update(data)
    return Run(
        label=BASELINE_LABEL,
        kind="baseline",
        measures=measure(requests),
        paths=tuple(paths_list),
        trace_digest=digest.hexdigest(),
        target=", ".join(upstreams),
        model=", ".join(sorted({str(m) for m in np.unique(cols.model) if m})) if n else "",
    )
