"""Every figure of a report in one JSON-ready dict (schema in docs/report.md); renderers only format it.

Keys are stable and carry units (`runs[0].ttft_ms.p99`); a figure that could not be measured is
null, and every summary carries the count of requests (or gaps) it covers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from replayproxy.report import breakdown, cache, contracts, fidelity, gpu, telemetry, verdict
from replayproxy.report.compare import Comparison, comparable, compare
from replayproxy.report.decision_types import ComparisonDoc, MetricComparisonDoc, QuantileComparisonDoc
from replayproxy.report.document_types import (
    Document,
    GoodputDoc,
    GroupDoc,
    RunDoc,
    SessionsDoc,
    ShardClockDoc,
    SloClause,
    StepDoc,
    SweepDoc,
    TelemetryDoc,
    WindowDoc,
)
from replayproxy.report.goodput import Goodput, Slo, goodput
from replayproxy.report.measures import Measures, concurrency, exact_share
from replayproxy.report.runs import Run, ShardClock, candidates
from replayproxy.report.sessions import session_columns, session_doc
from replayproxy.report.stats import summarize
from replayproxy.report.sweep import ATTAINMENT, Step, find_knee, meets, step_of

SCHEMA = "replayproxy-report/1"
LAG_WARN_MS = verdict.LAG_WARN_MS
# Verdict warnings not already among the per-run ones.
VERDICT_ONLY_WARNINGS = ("run-to-run noise", "repetitions of", "cache not reset", "not a like-for-like")


def num(value: float) -> float | None:
    """JSON number or null for NaN/inf."""
    return float(value) if math.isfinite(value) else None


def build_document(
    runs: list[Run],
    *,
    baseline: Run | None = None,
    slos: tuple[Slo, ...] = (),
    slo_spec: str = "",
    resamples: int = 1000,
    seed: int = 0,
    max_error_rate: float = 0.01,
    read_warnings: Sequence[str] = (),
) -> Document:
    """`read_warnings`: what reading the result files saw (files read in part, copies left out)."""
    columns = [*runs, *([baseline] if baseline is not None else [])]
    sweeps = [sweep_doc(group, slos, max_error_rate) for group in sweep_groups(runs)]
    doc: Document = {
        "verdict": verdict.build(runs, baseline, slos, slo_spec, sweeps, resamples=resamples, seed=seed),
        "fidelity": fidelity.fidelity_doc(runs, baseline, resamples=resamples, seed=seed),
        "schema": SCHEMA,
        "slo": {"spec": slo_spec, "clauses": [slo_doc(s) for s in slos]} if slos else None,
        "runs": [run_doc(r, slos, baseline) for r in columns],
        "comparisons": [comparison_doc(c) for c in comparisons(runs, baseline, resamples, seed)],
        "sweeps": sweeps,
        "contracts": [contracts.contract_of(g[0]) for g in candidates(runs)],
        "warnings": [
            *read_warnings,
            *cache.header_notes(columns),
            *(w for r in columns for w in run_warnings(r)),
        ],
    }
    doc["warnings"] += [w for w in doc["verdict"]["warnings"] if w.startswith(VERDICT_ONLY_WARNINGS)]
    return doc


def slo_doc(slo: Slo) -> SloClause:
    return {"metric": slo.metric, "percentile": slo.percentile, "limit_ms": slo.limit_ms, "text": slo.text}


def run_doc(run: Run, slos: tuple[Slo, ...], baseline: Run | None = None) -> RunDoc:
    """`baseline`: the production trace's run, beside which each call's cached-token share is put."""
    m = run.measures
    req = m.requests
    duration = m.duration_s if m.duration_s > 0 else math.nan
    errors = Counter(str(e) for e in req.error[~m.ok])
    timed = int((m.ok & np.isfinite(m.e2e_ms)).sum())
    mean_conc, peak_conc = concurrency(m) if timed else (math.nan, None)
    ok_out = m.output_tokens[m.ok]
    ok_in = m.input_tokens[m.ok]
    scheduled = req.scheduled_ns[req.scheduled_ns >= 0]
    span = float(scheduled.max() - scheduled.min()) / 1e9 if len(scheduled) > 1 else math.nan
    in_share, in_count = exact_share(req.input_tokens, req.expected_input_tokens)
    out_share, out_count = exact_share(req.output_tokens, req.expected_output_tokens)
    return {
        "label": run.label,
        "name": run.name,
        "repetition": run.repetition,
        "repetitions": run.repetitions,
        "kind": run.kind,
        "paths": list(run.paths),
        "target": run.target,
        "model": run.model,
        "trace_digest": run.trace_digest,
        "speed": run.speed,
        "shards": run.shards,
        "token_timing": run.token_timing,
        "options": run.options,
        "requests": m.n,
        "succeeded": int(m.ok.sum()),
        "partial": {"stopped_after_s": run.stopped_after_s, "cancelled": run.cancelled}
        if run.partial
        else None,
        "errors": {
            "count": int((~m.ok).sum()),
            "rate": num((~m.ok).sum() / m.n) if m.n else None,
            "by_class": dict(sorted(errors.items())),
        },
        "duration_s": num(m.duration_s),
        "offered_requests_per_s": num(len(scheduled) / span) if len(scheduled) > 1 else None,
        "requests_per_s": num(m.ok.sum() / duration),
        "output_tokens_per_s": _rate(ok_out, duration),
        "input_tokens_per_s": _rate(ok_in, duration),
        "timed_requests": timed,
        "concurrency": {"mean": num(mean_conc), "peak": peak_conc},
        "input_tokens": summarize(ok_in).to_dict(),
        "output_tokens": summarize(ok_out).to_dict(),
        "output_tokens_from_usage_share": num(float(np.mean(m.output_from_usage[m.ok])))
        if m.ok.any()
        else None,
        "ttft_ms": summarize(m.ttft_ms).to_dict(),
        "tpot_ms": summarize(m.tpot_ms).to_dict(),
        "itl_ms": summarize(m.itl_ms).to_dict(),
        "itl_unit": "token" if m.itl_per_token else "chunk",
        "e2e_ms": summarize(m.e2e_ms).to_dict(),
        "schedule_lag_ms": summarize(m.lag_ms).to_dict(),
        "ttft_from_scheduled_ms": summarize(m.ttft_sched_ms).to_dict(),
        "e2e_from_scheduled_ms": summarize(m.e2e_sched_ms).to_dict(),
        "exact_input_share": num(in_share),
        "exact_input_count": in_count,
        "exact_output_share": num(out_share),
        "exact_output_count": out_count,
        # Known when a request has timings, or when every one failed (0 good); not for a synthetic trace.
        "goodput": goodput_doc(goodput(m, slos)) if slos and (timed or (m.n and not m.ok.any())) else None,
        "telemetry": _telemetry_doc(run, m.n),
        "gpu": [gpu.summarize(record) for record in run.extras.get("gpu", [])][0]
        if run.extras.get("gpu")
        else None,
        "trace_prefix_reuse": _trace_prefix_reuse(run),
        "prefix_cache": cache.prefix_cache_doc(run),
        "sessions": _sessions_doc(m),
        "cached_share": cache.cached_share_doc(run, baseline),
        "shard_clocks": [_shard_clock_doc(c) for c in run.shard_clocks],
        "breakdowns": {
            "input_length": [group_doc(g) for g in breakdown.by_input_length(m)],
            "endpoint": [group_doc(g) for g in breakdown.by_endpoint(m)],
            "window_10s": [window_doc(g) for g in breakdown.by_window(m)],
        },
    }


def _sessions_doc(m: Measures) -> SessionsDoc | None:
    columns = session_columns(m.requests, m.ttft_ms, m.e2e_ms)
    return session_doc(columns) if columns is not None else None


def _telemetry_doc(run: Run, requests: int) -> TelemetryDoc | None:
    """The engine's own view of the run, from the first telemetry record (one per run)."""
    records = run.extras.get("telemetry", [])
    return telemetry.summarize(records[0], requests) if records else None


def _shard_clock_doc(record: ShardClock) -> ShardClockDoc:
    reference = record.get("reference")
    return {
        "shard": record["shard"],
        "lag_p99_ms": num(record["lag_p99_ms"]),
        "clock_offset_ms": _scaled(reference["offset_ns"] if reference else None, 1e-6),
        "clock_offset_bound_ms": _scaled(reference["bound_ns"] if reference else None, 1e-6),
        "clock_reference": reference["source"] if reference else None,
        "ready_before_start_s": _scaled(record.get("ready_before_start_ns"), 1e-9),
        "wall_drift_ms": _scaled(record.get("wall_drift_ns"), 1e-6),
    }


def _scaled(value: int | None, scale: float) -> float | None:
    """A figure of a result header (checked when read), scaled; None where it is missing."""
    return None if value is None else num(value * scale)


def _trace_prefix_reuse(run: Run) -> float | None:
    """The replayed trace's prefix reuse, as the replayer stored it, beside the engine's hit rate."""
    profiles = run.extras.get("trace_profile", [])
    value = profiles[0].get("prefix_reuse") if profiles else None
    return float(value) if isinstance(value, int | float) else None


def _rate(tokens: np.ndarray, duration_s: float) -> float | None:
    """Tokens per second over the run, or null when no request's count is known."""
    known = tokens[np.isfinite(tokens)]
    return num(float(known.sum()) / duration_s) if len(known) else None


def goodput_doc(g: Goodput) -> GoodputDoc:
    return {
        "requests_per_s": num(g.requests_per_s),
        "fraction": num(g.fraction),
        "good": g.good,
        "of": g.total,
        "percentile_checks": [
            {
                "slo": c.slo.text,
                "value_ms": num(c.value_ms),
                "limit_ms": c.slo.limit_ms,
                "count": c.count,
                "met": c.met,
            }
            for c in g.checks
        ],
        "percentiles_met": g.percentiles_met,
        "not_applicable": g.not_applicable,
        "sessions": None
        if g.sessions is None
        else {
            "sessions_per_s": num(g.sessions.sessions_per_s),
            "fraction": num(g.sessions.fraction),
            "good": g.sessions.good,
            "of": g.sessions.total,
        },
    }


def group_doc(g: breakdown.Group) -> GroupDoc:
    return {
        "name": g.name,
        "requests": g.requests,
        "errors": g.errors,
        "ttft_ms": g.ttft_ms.to_dict(),
        "tpot_ms": g.tpot_ms.to_dict(),
        "e2e_ms": g.e2e_ms.to_dict(),
    }


def window_doc(g: breakdown.Group) -> WindowDoc:
    return {
        "name": g.name,
        "requests": g.requests,
        "errors": g.errors,
        "start_s": g.start_s,
        "arrival_rate_per_s": g.arrival_rate_per_s,
        "ttft_ms": g.ttft_ms.to_dict(),
        "tpot_ms": g.tpot_ms.to_dict(),
        "e2e_ms": g.e2e_ms.to_dict(),
    }


def comparisons(runs: list[Run], baseline: Run | None, resamples: int, seed: int) -> list[Comparison]:
    """Each candidate (its repetitions together) against the first candidate of the same trace at the
    same speed; the baseline against candidates of its trace at speed 1. Runs at different speeds
    (sweep steps) are not compared: that compares loads, not engines.
    """
    out = []
    first_at: dict[tuple[str, tuple[float | None, int]], list[Run]] = {}
    groups = candidates(runs)
    for group in groups:
        reference = first_at.setdefault((group[0].trace_digest, group[0].load), group)
        if reference is not group and comparable(reference[0], group[0]):
            out.append(compare(reference, group, resamples=resamples, seed=seed))
    if baseline is not None:
        out.extend(
            compare([baseline], g, resamples=resamples, seed=seed)
            for g in groups
            if g[0].load in ((None, 0), (1.0, 0)) and comparable(baseline, g[0])
        )
    return out


def comparison_doc(c: Comparison) -> ComparisonDoc:
    metrics = {
        mc.metric: MetricComparisonDoc(
            pairs=mc.pairs,
            median_ratio_b_over_a=num(mc.median_ratio),
            share_faster_b=num(mc.share_faster_b),
            quantiles={
                q: QuantileComparisonDoc(
                    ci.to_dict(), {"a": mc.spreads[q][0], "b": mc.spreads[q][1]}, mc.verdict(q)
                )
                for q, ci in mc.diffs.items()
            },
        )
        for mc in c.metrics
    }
    return ComparisonDoc(
        a=c.a,
        b=c.b,
        runs_a=c.runs_a,
        runs_b=c.runs_b,
        run_to_run_noise="measured" if c.noise_known else "unknown",
        common_requests=c.common,
        only_a=c.only_a,
        only_b=c.only_b,
        metrics=metrics,
    )


def sweep_groups(runs: list[Run]) -> list[list[Run]]:
    """Runs of one label, trace, target and model at two or more distinct loads (speeds, or
    concurrency limits), each load's first repetition, in load order."""
    groups: dict[tuple[str, str, str, str, bool], dict[tuple[float | None, int], Run]] = {}
    for run in runs:
        if run.kind == "replay" and run.speed is not None:
            key = (run.label, run.trace_digest, run.target, run.model, bool(run.concurrency_limit))
            groups.setdefault(key, {}).setdefault(run.load, run)
    return [
        sorted(g.values(), key=lambda r: (r.concurrency_limit, r.speed or 0.0))
        for g in groups.values()
        if len(g) >= 2
    ]


def sweep_doc(
    group: list[Run],
    slos: tuple[Slo, ...],
    max_error_rate: float,
    best_speed: float | None = None,
    attainment: float = ATTAINMENT,
) -> SweepDoc:
    steps = [step_of(r, slos) for r in group]
    knee = find_knee(
        steps, max_error_rate, (lambda s: meets(s, max_error_rate, attainment)) if slos else None
    )
    point = steps[knee.step] if knee.step is not None else None
    meeting = [s for s in steps if slos and meets(s, max_error_rate, attainment)]
    return {
        "label": group[0].label,
        "target": group[0].target,
        "model": group[0].model,
        "trace_digest": group[0].trace_digest,
        "closed_loop": bool(steps and steps[0].concurrency_limit),
        "steps": [step_doc(s) for s in steps],
        "knee_speed": point.speed if point is not None else None,
        "broke_at_speed": steps[knee.broke_at].speed if knee.broke_at is not None else None,
        "operating_point": step_doc(point) if point is not None else None,
        "saturated_at_lowest_step": knee.step is None and knee.broke_at is not None,
        "break_reasons": list(knee.reasons),
        "knee": knee.describe(steps),
        "noise": list(knee.noise),
        "max_rate_under_slo": max(s.requests_per_s for s in meeting) if meeting else None,
        "best_speed_meeting_slo": best_speed,
        "max_error_rate": max_error_rate,
    }


def step_doc(s: Step) -> StepDoc:
    return {
        "speed": s.speed,
        "concurrency_limit": s.concurrency_limit or None,
        "offered_requests_per_s": num(s.offered_requests_per_s),
        "load": s.load_text,
        "slo_crossed": list(s.slo_crossed),
        "label": s.label,
        "requests": s.requests,
        "requests_per_s": num(s.requests_per_s),
        "output_tokens_per_s": num(s.output_tokens_per_s),
        "mean_concurrency": num(s.mean_concurrency),
        "ttft_ms": s.ttft_ms.to_dict(),
        "tpot_ms": s.tpot_ms.to_dict(),
        "e2e_ms": s.e2e_ms.to_dict(),
        "errors": s.errors,
        "error_rate": num(s.error_rate),
        "goodput": goodput_doc(s.goodput) if s.goodput is not None else None,
    }


def run_warnings(run: Run) -> list[str]:
    """Things that limit what a run's figures mean (client bottleneck, late preparation, capped
    concurrency, a partial run)."""
    out = []
    if run.partial:
        stopped = f" after {run.stopped_after_s:g} s" if run.stopped_after_s is not None else ""
        out.append(
            f"{run.name}: partial run, interrupted{stopped}; its {run.cancelled} requests still in flight "
            "are left out (not counted as errors)"
        )
    lag = summarize(run.measures.lag_ms)
    if lag.count and lag.p99 > LAG_WARN_MS:
        out.append(
            f"{run.name}: schedule lag p99 {lag.p99:.1f} ms > {LAG_WARN_MS:g} ms: the client was a "
            "bottleneck; see ttft_from_scheduled_ms / e2e_from_scheduled_ms"
        )
    if run.prepared_late:
        out.append(
            f"{run.name}: request preparation fell behind: {run.prepared_late} requests were sent late "
            "because their bodies were not ready (their schedule lag includes the wait)"
        )
    cap = run.options.get("max_concurrency")
    if cap:
        out.append(
            f"{run.name}: in-flight requests were capped at {cap}, so arrival timing was not preserved "
            f"(schedule lag p99 {lag.p99:.1f} ms)"
        )
    return out
