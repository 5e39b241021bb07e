"""How faithful a replay of production's own trace was: per figure, replay vs production, and why.

When replays of a trace sit beside that trace's baseline (`report RUN... --baseline TRACE`), each
figure (TTFT, TPOT, E2E at p50 and p95) is compared with production's: the difference of the
replays' mean quantile and production's, with a bootstrap interval over the replays' repetitions
and then requests (report.noise). A figure is within noise when that interval holds zero or the
difference is no larger than the replays' own spread. Beside them, the differences between the two
measurements that are known, each with its measured size: the replayer's schedule lag, bodies
prepared late, calls the replayer made to the target that production did not (tokenize calls for
live replies), the prefix-cache hits against production's, the proxy's hop (production is timed at
the proxy) and the load each side ran at. When every figure is within noise the statement says the
replay reproduces production; otherwise it names, per figure, the differences that push its way.

Production is timed at its proxy. A replay sent through a proxy in the same position (`replay
--via-proxy`) is timed there too: its figures come from that proxy's trace of the run, so both
sides are measured at one point; otherwise the replayer's own timings stand in, and the proxy's
hop is listed as a difference of unknown size.
"""

from __future__ import annotations

import math

import numpy as np

from replayproxy.errors import BadInputFile
from replayproxy.report import cache, noise
from replayproxy.report.baseline import baseline_run
from replayproxy.report.compare import comparable
from replayproxy.report.document_types import FidelityDifferenceDoc, FidelityDoc, FidelityFigureDoc
from replayproxy.report.measures import Measures, concurrency
from replayproxy.report.runs import Run, candidates

FIGURES = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2e_ms"))
QUANTILES = (50, 95)
LAG_MS = 5.0  # schedule lag p99 above this delays sends noticeably
CACHE_GAP = 0.01  # prefix-cache hits further than this from production's change prefill work
LOAD_GAP = 0.05  # mean concurrency further than this from production's changes batching
REPRODUCES = "the replay reproduces production"
PLANNED_REPLIES = (
    "; planned replies: later turns do not carry the engine's own replies, which production's cache held"
)


def _values(m: Measures, key: str) -> np.ndarray:
    values: np.ndarray = getattr(m, key)
    return values


def _figure(
    production: Run, runs: list[Measures], name: str, key: str, q: int, seed: int, resamples: int
) -> FidelityFigureDoc:
    base = [_values(production.measures, key)]
    replays = [_values(m, key) for m in runs]
    prod = noise.run_quantiles(base, q / 100)[0]
    replay = float(np.mean(noise.run_quantiles(replays, q / 100)))
    diff = noise.quantile_difference(base, replays, q / 100, resamples=resamples, seed=seed)
    spread = noise.spread(noise.run_quantiles(replays, q / 100))

    def rel(ms: float) -> float | None:
        return ms / prod if math.isfinite(ms) and math.isfinite(prod) and prod > 0 else None

    within = not noise.clear(diff, 0.0, [spread])
    return {
        "figure": name,
        "quantile": q,
        "production_ms": prod if math.isfinite(prod) else None,
        "replay_ms": replay if math.isfinite(replay) else None,
        "difference": rel(diff.estimate),
        "low": rel(diff.low),
        "high": rel(diff.high),
        "replay_spread": rel(spread) if spread is not None else None,
        "within_noise": bool(within or not math.isfinite(diff.estimate)),
    }


def _cached_share(production: Run, runs: list[Run]) -> float | None:
    """The replays' cached prompt tokens over production's, on requests both measured (per-request
    `cached_tokens`, where the engine reports them), mean over the replays."""
    base = production.measures.requests
    if not len(base.cached_tokens) or not np.any(base.cached_tokens > 0):
        return None
    shares = []
    for run in runs:
        req = run.measures.requests
        if not len(req.cached_tokens):
            continue
        _, a, b = np.intersect1d(base.index, req.index, return_indices=True)
        both = (base.cached_tokens[a] >= 0) & (req.cached_tokens[b] >= 0) & run.measures.ok[b]
        total = int(base.cached_tokens[a][both].sum())
        if total > 0:
            shares.append(int(req.cached_tokens[b][both].sum()) / total)
    return float(np.mean(shares)) if shares else None


def timed_at_proxy(run: Run) -> Measures | None:
    """The run's timings as the proxy it was sent through recorded them (`replay --via-proxy`);
    None when it went straight to the target or that trace cannot be read."""
    where = run.options.get("via_proxy")
    if not isinstance(where, str) or not where:
        return None
    try:
        return baseline_run(where).measures
    except (OSError, BadInputFile):  # moved or removed since the run, or not a trace
        return None


def _hop(runs: list[Run], at_proxy: list[Measures | None]) -> FidelityDifferenceDoc:
    """Whether both sides were timed at a proxy, and what the hop added as the replayer saw it."""
    sent_through = [r for r in runs if r.options.get("via_proxy")]
    if at_proxy and all(m is not None for m in at_proxy):
        added = [
            float(np.nanpercentile(r.measures.ttft_ms, 50) - np.nanpercentile(m.ttft_ms, 50))
            for r, m in zip(runs, at_proxy, strict=True)
            if m is not None and np.isfinite(r.measures.ttft_ms).any() and np.isfinite(m.ttft_ms).any()
        ]
        seen = f"; at the replayer it added {np.mean(added):+.2f} ms to TTFT p50" if added else ""
        return {
            "name": "proxy hop",
            "size": "none: the replay went through a proxy in production's position (--via-proxy) and is "
            "timed there, as production was" + seen,
            "value": float(np.mean(added)) if added else None,
            "effect": "",
        }
    missing = f" ({len(sent_through)} runs' proxy traces not readable)" if sent_through else ""
    return {
        "name": "proxy hop",
        "size": "production is timed at the proxy (its forwarding included), the replay at the replayer; "
        f"its size is not in these files{missing} (replay --via-proxy DIR times both at a proxy)",
        "value": None,
        "effect": "",
    }


def _differences(
    production: Run, runs: list[Run], at_proxy: list[Measures | None]
) -> list[FidelityDifferenceDoc]:
    lags = [
        float(np.nanpercentile(r.measures.lag_ms, 99)) for r in runs if np.isfinite(r.measures.lag_ms).any()
    ]
    lag = max(lags) if lags else None
    late = sum(r.prepared_late for r in runs)
    calls = [int(rec.get("target_calls", 0)) for r in runs for rec in r.extras.get("live_replies", [])]
    engine = [d["engine_over_implied"] for r in runs if (d := cache.prefix_cache_doc(r)) is not None]
    engine_share = [e for e in engine if e is not None]
    vs_production = _cached_share(production, runs)
    prod_load = concurrency(production.measures)[0]
    replay_load = float(np.mean([concurrency(r.measures)[0] for r in runs]))
    load = replay_load / prod_load - 1 if prod_load > 0 else None
    hits = vs_production - 1 if vs_production is not None else None
    out: list[FidelityDifferenceDoc] = [
        {
            "name": "schedule lag",
            "size": f"p99 {lag:.2f} ms (worst run)" if lag is not None else "not measured",
            "value": lag,
            "effect": "heavier" if lag is not None and lag > LAG_MS else "",
        },
        {
            "name": "prepared late",
            "size": f"{late} requests",
            "value": float(late),
            "effect": "heavier" if late else "",
        },
        {
            "name": "extra calls to the target",
            "size": f"{sum(calls)} tokenize calls during the run{'s' if len(runs) > 1 else ''} (live replies "
            "sized through the engine's endpoint: no local copy of its tokenizer)"
            if sum(calls)
            else "0",
            "value": float(sum(calls)),
            "effect": "heavier" if sum(calls) else "",
        },
        {
            "name": "prefix-cache hits",
            "size": (f"{vs_production:.1%} of production's cached tokens" if vs_production is not None else
                     "production's per-request cached tokens not recorded")
            + (f"; engine / implied {np.mean(engine_share):.1%}" if engine_share else "")
            + (PLANNED_REPLIES if any(r.options.get("replies") == "planned" for r in runs) else ""),
            "value": hits,
            "effect": _effect(hits, CACHE_GAP, more="lighter"),
        },
        _hop(runs, at_proxy),
        {
            "name": "load",
            "size": f"mean concurrency {replay_load:.2f} replayed vs {prod_load:.2f} in production"
            + (f" ({load:+.1%})" if load is not None else ""),
            "value": load,
            "effect": _effect(load, LOAD_GAP, more="heavier"),
        },
    ]  # fmt: skip
    return out


def _effect(change: float | None, negligible: float, more: str) -> str:
    """Which way a relative change pushes the replay ("" within `negligible`); `more`: when it is up."""
    if change is None or abs(change) <= negligible:
        return ""
    return more if change > 0 else ("heavier" if more == "lighter" else "lighter")


def _statement(figures: list[FidelityFigureDoc], differences: list[FidelityDifferenceDoc]) -> list[str]:
    off = [f for f in figures if not f["within_noise"]]
    if not off:
        return [f"{REPRODUCES}: every figure is within run-to-run noise"]
    lines = []
    for f in off:
        way = "heavier" if (f["difference"] or 0) > 0 else "lighter"
        causes = [d["name"] for d in differences if d["effect"] == way]
        why = f"; explained by: {', '.join(causes)}" if causes else "; no known difference explains it"
        lines.append(
            f"{f['figure']} p{f['quantile']} is {abs(f['difference'] or 0):.1%} {way} than production{why}"
        )
    return lines


def fidelity_doc(
    runs: list[Run], baseline: Run | None, *, resamples: int = 1000, seed: int = 0
) -> list[FidelityDoc]:
    """One statement per candidate that replayed the baseline's own trace; [] without a baseline."""
    if baseline is None:
        return []
    docs: list[FidelityDoc] = []
    for group in candidates(runs):
        if not comparable(group[0], baseline):
            continue
        at_proxy = [timed_at_proxy(r) for r in group]
        timed = [m if m is not None else r.measures for r, m in zip(group, at_proxy, strict=True)]
        figures = [
            _figure(baseline, timed, name, key, q, seed + 10 * i + q, resamples)
            for i, (name, key) in enumerate(FIGURES)
            for q in QUANTILES
        ]
        differences = _differences(baseline, group, at_proxy)
        docs.append(
            {
                "candidate": group[0].label,
                "runs": len(group),
                "figures": figures,
                "differences": differences,
                "reproduces": all(f["within_noise"] for f in figures),
                "statement": _statement(figures, differences),
            }
        )
    return docs
