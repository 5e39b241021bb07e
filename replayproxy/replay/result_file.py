"""The result file of a run: its header (the measurement contract) and the results in trace order."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

from replayproxy import __version__
from replayproxy.replay import summary
from replayproxy.replay.connection import Target
from replayproxy.replay.options import ReplayOptions
from replayproxy.replay.preparation import RunPlan
from replayproxy.results import ReplayResult, ResultWriter, RunClock, RunHeader


def header_for(
    options: ReplayOptions,
    run: RunPlan,
    start_wall_ns: int,
    token_timing: str,
    clock: RunClock | None = None,
) -> RunHeader:
    return RunHeader(
        label=options.label or f"{run.flavor.name}@{Target.parse(options.target).host_header}",
        target=options.target,
        start_wall_ns=start_wall_ns,
        trace_paths=run.trace_paths,
        trace_digest=run.trace_digest,
        flavor=run.flavor.name,
        models=run.info.models,
        engine_version=run.info.engine_version,
        options={**options.recorded(), "speed": run.speed},
        pre_run=run.pre_run,
        replayproxy_version=__version__,
        host=socket.gethostname(),
        token_timing=token_timing,
        shard=options.shard,
        repetition=run.repetition,
        repetitions=options.repeat,
        warmup=run.warmup,
        contract=run.contract,
        clock=clock or {},
    )


def write_results(
    options: ReplayOptions,
    run: RunPlan,
    results: Sequence[ReplayResult],
    start_wall_ns: int,
    extras: dict[str, dict[str, Any]] | None = None,
    stopped_s: float | None = None,
    clock: RunClock | None = None,
) -> summary.Summary:
    """Write the .rpr (results in trace order) with the summary as footer; returns the summary.

    `stopped_s`: the run was interrupted that many seconds after its start; the footer says it is
    partial, so reports neither take it for a whole run nor count its cut-off requests as errors.
    `clock`: what the run measured of its clock (replay.clock_offset.record).
    """
    ordered = sorted(results, key=lambda r: r.index)
    token_timing = "token" if any(r.chunk_tokens for r in ordered) else "chunk"
    facts = summary.summarize(ordered, options.max_concurrency)
    facts["recorded_failures_left_out"] = run.pre_run.get("recorded_failures_left_out", 0)
    prompts = run.pre_run.get("prompts", {})
    facts["lengths"] = prompts.get("lengths", "approximate")
    facts["tokenizer"] = prompts.get("tokenizer")
    if stopped_s is not None:
        facts["partial"] = True
        facts["stopped_after_s"] = round(stopped_s, 3)
        facts["planned_requests"] = run.requests
    writer = ResultWriter(options.output, header_for(options, run, start_wall_ns, token_timing, clock))
    for result in ordered:
        writer.write(result)
    writer.write_extra("trace_profile", run.trace_profile)
    for kind, record in (extras or {}).items():
        writer.write_extra(kind, record)
    writer.close(summary=facts)
    return facts
