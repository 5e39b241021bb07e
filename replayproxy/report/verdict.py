"""The verdict: the first lines of every report, saying which candidate to run and how sure that is.

At most VERDICT_LINES lines: each candidate's goodput under the SLO (req/s and share, runs), its
highest rate under the SLO when a sweep measured one, one sentence naming the winner with its
margin, interval and number of runs (or "no clear difference"), the metric that decided it, and
every warning that weakens it. Intervals come from report.noise (runs, then requests); a winner
is named only when the interval excludes "equal", the margin exceeds the spread between the
candidates' own repetitions, and a goodput margin is at least GOODPUT_EQUIVALENCE: when both meet
the SLO for every request, goodput is the offered rate and differs only by when each run's last
reply ended, a difference no engine choice should rest on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from replayproxy.report import contracts, noise
from replayproxy.report.decision_types import (
    CandidateDoc,
    CandidateGoodput,
    GoodputOverNone,
    IntervalDoc,
    VerdictDoc,
)
from replayproxy.report.document_types import SweepDoc
from replayproxy.report.goodput import Slo, goodput
from replayproxy.report.runs import Run, candidates
from replayproxy.report.stats import Interval, summarize

VERDICT_LINES = 13  # plus the title and its rule: the report opens with at most 15 lines
MAX_CANDIDATE_LINES = 6
LAG_WARN_MS = 5.0  # schedule lag p99 above this: the client, not the target, limited the run
REPEAT_HINT = "--repeat 3"
GOODPUT_EQUIVALENCE = 0.01  # goodput ratios within 1 % of 1.00 are "no clear difference"


def pool(runs: list[Run]) -> list[list[Run]]:
    """The candidates the verdict compares: those replaying the first candidate's trace at its speed."""
    groups = [g for g in candidates(runs) if g[0].kind == "replay"]
    if not groups:
        return []
    first = groups[0][0]
    return [g for g in groups if g[0].trace_digest == first.trace_digest and g[0].load == first.load]


def _counts(group: list[Run], slos: tuple[Slo, ...]) -> list[noise.RunCount]:
    """Each run's good and total units: sessions under a per-session clause (makespan), else requests."""
    out = []
    for run in group:
        g = goodput(run.measures, slos)
        good, total = (g.sessions.good, g.sessions.total) if g.sessions else (g.good, g.total)
        out.append(noise.RunCount(good, total, run.measures.duration_s))
    return out


def _unit(slos: tuple[Slo, ...]) -> str:
    """What goodput counts: "sessions" when a clause judges whole sessions, else "req"."""
    return "sessions" if any(s.per_session for s in slos) else "req"


def _runs_text(a: list[Run], b: list[Run]) -> str:
    """How many runs the sentence rests on; with one run of either, the winner is only provisional."""
    runs = (
        f"{len(a)} run{'s' if len(a) > 1 else ''} each" if len(a) == len(b) else f"{len(b)} and {len(a)} runs"
    )
    return runs if len(a) > 1 and len(b) > 1 else f"{runs} (provisional: run-to-run noise unknown)"


def _ci(i: Interval, digits: str = ".2f") -> str:
    return f"95% CI [{i.low:{digits}}, {i.high:{digits}}]"


@dataclass(frozen=True, slots=True)
class Decision:
    """Who won, against whom, by what margin, and the sentence that says so."""

    sentence: str
    metric: str  # "goodput" or "ttft_p50"
    metric_text: str  # what the "decided by:" line names
    winner: str | None = None
    versus: str | None = None
    margin: IntervalDoc | GoodputOverNone | None = None


def build(
    runs: list[Run],
    baseline: Run | None,
    slos: tuple[Slo, ...],
    slo_spec: str,
    sweeps: list[SweepDoc],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> VerdictDoc:
    """The verdict as data (`lines` is what every renderer prints first)."""
    groups = pool(runs)
    lines: list[str] = []
    entries = [_entry(group, slos) for group in groups]
    for entry in entries[:MAX_CANDIDATE_LINES]:
        lines.append(_entry_line(entry, slo_spec))
    if len(entries) > MAX_CANDIDATE_LINES:
        lines.append(f"... {len(entries) - MAX_CANDIDATE_LINES} more candidates in the tables below")
    if baseline is not None and slos and int(np.isfinite(baseline.measures.e2e_ms).sum()):
        (c,) = _counts([baseline], slos)
        rate = f"{c.rate:.3g} {_unit(slos)}/s ({c.good / c.total if c.total else math.nan:.1%})"
        lines.append(f"{baseline.label}: goodput {rate}, as recorded in production")
    for sweep in sweeps:
        if (max_rate := sweep["max_rate_under_slo"]) is not None:
            lines.append(f"{sweep['label']}: max rate under the SLO {max_rate:.3g} req/s (sweep)")
    decision = _decide(groups, slos, resamples, seed)
    lines.append(decision.sentence)
    lines.append(f"decided by: {decision.metric_text if not slos else 'goodput under ' + slo_spec}")
    warnings = _warnings(groups)
    room = VERDICT_LINES - len(lines)
    shown = warnings
    if len(warnings) > room:
        kept = warnings[: max(room - 1, 0)]
        shown = [*kept, f"warning: {len(warnings) - len(kept)} more warnings under Warnings below"]
    lines.extend(shown)
    return {
        "lines": lines[:VERDICT_LINES],
        "candidates": entries,
        "winner": decision.winner,
        "versus": decision.versus,
        "metric": decision.metric,
        "margin": decision.margin,
        "noise": "measured" if groups and all(len(g) > 1 for g in groups) else "unknown",
        "warnings": [w.removeprefix("warning: ") for w in warnings],
    }


def _entry(group: list[Run], slos: tuple[Slo, ...]) -> CandidateDoc:
    goodput_figures = None
    if slos:
        counts = _counts(group, slos)
        total = sum(c.total for c in counts)
        rates = [c.rate for c in counts]
        goodput_figures = CandidateGoodput(
            requests_per_s=_num(noise.pooled_rate(counts)),
            fraction=_num(sum(c.good for c in counts) / total) if total else None,
            run_range=(_num(min(rates)), _num(max(rates))) if len(group) > 1 else None,
            requests=total,
            unit=_unit(slos),
        )
    ttft = [summarize(r.measures.ttft_ms).p50 for r in group]
    return CandidateDoc(group[0].label, len(group), goodput_figures, _num(float(np.mean(ttft))))


def _entry_line(entry: CandidateDoc, slo_spec: str) -> str:
    runs = f"{entry.runs} run{'s' if entry.runs > 1 else ''}"
    g = entry.goodput
    if g is None:
        return f"{entry.label}: TTFT p50 {_fmt(entry.ttft_p50_ms)} ms, {runs} (no --slo: no goodput)"
    spread = ""
    if g.run_range is not None and g.requests_per_s:
        low, high = g.run_range
        spread = f", runs {_fmt(low)}-{_fmt(high)}"
    share = "-" if g.fraction is None else f"{g.fraction:.1%}"
    rate = f"{_fmt(g.requests_per_s)} {g.unit}/s"
    return f"{entry.label}: goodput {rate} ({share} meet {slo_spec}), {runs}{spread}"


def _decide(groups: list[list[Run]], slos: tuple[Slo, ...], resamples: int, seed: int) -> Decision:
    if len(groups) < 2:
        what = "no replay run" if not groups else "one candidate: nothing to compare it with"
        return Decision(what, "goodput" if slos else "ttft_p50", "-")
    if slos:
        return _decide_goodput(groups, slos, resamples, seed)
    return _decide_ttft(groups, resamples, seed)


def _decide_goodput(groups: list[list[Run]], slos: tuple[Slo, ...], resamples: int, seed: int) -> Decision:
    counts = {id(g): _counts(g, slos) for g in groups}
    ranked = sorted(groups, key=lambda g: -_finite(noise.pooled_rate(counts[id(g)])))
    best, second = ranked[0], ranked[1]
    a, b = counts[id(second)], counts[id(best)]
    ratio = noise.goodput_ratio(a, b, resamples=resamples, seed=seed)
    spreads = [_relative_spread(c) for c in (a, b)]
    runs = _runs_text(second, best)
    unit = _unit(slos)
    one = "session" if unit == "sessions" else "request"
    base = Decision("", "goodput", "goodput", versus=second[0].label)
    if noise.pooled_rate(a) == 0 and noise.pooled_rate(b) == 0:
        sentence = (
            f"no clear difference: neither {best[0].label} nor {second[0].label} meets the SLO "
            f"for any {one}, {runs}"
        )
        return replace(base, sentence=sentence)
    if noise.pooled_rate(a) == 0 and noise.pooled_rate(b) > 0:
        rate = noise.pooled_rate(b)
        sentence = (
            f"{best[0].label} wins with {rate:.3g} {unit}/s of goodput at this SLO: "
            f"{second[0].label} meets it for no {one}, {runs}"
        )
        return replace(base, sentence=sentence, winner=best[0].label, margin={"goodput_over_none": rate})
    if noise.clear(ratio, 1.0, spreads) and abs(ratio.estimate - 1.0) >= GOODPUT_EQUIVALENCE:
        sentence = (
            f"{best[0].label} sustains {ratio.estimate:.2f}x {second[0].label}'s goodput at this SLO, "
            f"{_ci(ratio)}, {runs}"
        )
        return replace(base, sentence=sentence, winner=best[0].label, margin=ratio.to_dict())
    sentence = (
        f"no clear difference: {best[0].label} vs {second[0].label} goodput {ratio.estimate:.2f}x, "
        f"{_ci(ratio) if math.isfinite(ratio.low) else 'interval unknown'}, {runs}"
    )
    return replace(base, sentence=sentence, margin=ratio.to_dict())


def _decide_ttft(groups: list[list[Run]], resamples: int, seed: int) -> Decision:
    values = {id(g): [r.measures.ttft_ms for r in g] for g in groups}
    medians = {id(g): float(np.mean(noise.run_quantiles(values[id(g)], 0.5))) for g in groups}
    ranked = sorted(groups, key=lambda g: _finite(medians[id(g)], high=True))
    best, second = ranked[0], ranked[1]
    diff = noise.quantile_difference(
        values[id(best)], values[id(second)], 0.5, resamples=resamples, seed=seed
    )
    spreads = [noise.spread(noise.run_quantiles(values[id(g)], 0.5)) for g in (best, second)]
    runs = _runs_text(second, best)
    base = Decision(
        "",
        "ttft_p50",
        "TTFT p50 (no --slo given; give one for a goodput verdict)",
        versus=second[0].label,
        margin=diff.to_dict(),
    )
    if noise.clear(diff, 0.0, spreads):
        sentence = (
            f"{best[0].label} has {diff.estimate:.3g} ms lower TTFT p50 than {second[0].label}, "
            f"{_ci(diff, '.3g')} ms, {runs}"
        )
        return replace(base, sentence=sentence, winner=best[0].label)
    sentence = f"no clear difference in TTFT p50: {best[0].label} vs {second[0].label}, {runs}"
    return replace(base, sentence=sentence)


def _relative_spread(counts: list[noise.RunCount]) -> float | None:
    spread = noise.spread([c.rate for c in counts])
    pooled = noise.pooled_rate(counts)
    return spread / pooled if spread is not None and pooled > 0 else spread


def _warnings(groups: list[list[Run]]) -> list[str]:
    """Everything that weakens the verdict, one line per kind, naming the candidates concerned."""
    out = []
    single = [g[0].label for g in groups if len(g) == 1]
    if single:
        out.append(
            f"warning: run-to-run noise unknown: one run of {', '.join(single)}; replay with {REPEAT_HINT}"
        )
    blocks = _in_blocks(groups)
    if blocks:
        out.append(
            f"warning: repetitions of {blocks} ran one candidate after the other: a drift of the machine "
            "over time counts as a difference; interleave them (A, B, A, B, ...)"
        )
    runs = [r for g in groups for r in g]
    lagged = [r.name for r in runs if summarize(r.measures.lag_ms).p99 > LAG_WARN_MS]
    if lagged:
        out.append(f"warning: client bottleneck (schedule lag p99 > {LAG_WARN_MS:g} ms): {', '.join(lagged)}")
    capped = [r.name for r in runs if r.options.get("max_concurrency")]
    if capped:
        out.append(f"warning: arrival timing not preserved (--max-concurrency): {', '.join(capped)}")
    not_reset = [(g[0].label, contracts.cache_reset(g[0])) for g in groups]
    not_reset = [(label, why) for label, why in not_reset if why != "ok"]
    if not_reset:
        out.append(
            "warning: cache not reset before the run: "
            + ", ".join(f"{label} ({why})" for label, why in not_reset)
        )
    partial = [r.name for r in runs if r.partial]
    if partial:
        out.append(f"warning: partial runs (interrupted): {', '.join(partial)}")
    damaged = [r.name for r in runs if r.damage]
    if damaged:
        out.append(f"warning: result files read in part (truncated or damaged): {', '.join(damaged)}")
    out.extend(f"warning: {d}" for d in contracts.differences([contracts.contract_of(g[0]) for g in groups]))
    return out


def _in_blocks(groups: list[list[Run]]) -> str:
    """'A and B' when both were repeated but every run of one started before every run of the other."""
    repeated = [g for g in groups if len(g) > 1]
    for i, a in enumerate(repeated):
        for b in repeated[i + 1 :]:
            starts_a = [h.start_wall_ns for r in a for h in r.headers]
            starts_b = [h.start_wall_ns for r in b for h in r.headers]
            if max(starts_a) < min(starts_b) or max(starts_b) < min(starts_a):
                return f"{a[0].label} and {b[0].label}"
    return ""


def _num(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _fmt(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.3g}"


def _finite(value: float, high: bool = False) -> float:
    return value if math.isfinite(value) else (math.inf if high else -math.inf)
