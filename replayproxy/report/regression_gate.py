"""A regression gate for CI: `--gate "goodput>=0.95*BASE,ttft:p95<=1.10*BASE"` against a named run.

Re-run at every engine upgrade: each candidate other than the base must keep every clause, where
BASE is the base candidate's value of the same figure (rates pooled over its repetitions, latency
the mean of each run's statistic). A clause is judged on the interval of candidate / BASE that the
verdict uses too (report.noise: runs, then requests): it fails only when the whole interval breaks
it, is inconclusive when the interval straddles the factor (run more repetitions), and passes
otherwise. Each judgement is one line naming the candidate, the clause, the ratio and its interval.
Rules are read by the one `--gate` grammar (report/gate.py) that output-check gates use too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from replayproxy.errors import BadOption
from replayproxy.report import noise
from replayproxy.report.gate import OPERATORS, GateRule, parse_gate
from replayproxy.report.goodput import Slo, goodput, pooled_values
from replayproxy.report.runs import Run
from replayproxy.report.stats import Interval
from replayproxy.report.verdict import pool

GATE_METRICS = ("goodput", "goodput_fraction", "requests_per_s", "error_rate", "ttft", "tpot", "itl", "e2e")
LATENCY = ("ttft", "tpot", "itl", "e2e")
UNITS = {"goodput": " req/s", "requests_per_s": " req/s", "goodput_fraction": "", "error_rate": ""}
STATS = ("p50", "p90", "p95", "p99", "max", "mean")


def parse_replay_gate(spec: str) -> tuple[GateRule, ...]:
    """Replay rules in the one `--gate` grammar (report/gate.py), each a factor of BASE; latency
    figures name a statistic, the others none. A BadOption names the rule and what is wrong."""
    rules = parse_gate(spec, GATE_METRICS)
    for rule in rules:
        if not rule.relative:
            raise BadOption(
                f"--gate {rule.text!r}: a replay figure is compared with BASE; write e.g. "
                "'goodput>=0.95*BASE,ttft:p95<=1.1*BASE'"
            )
        if rule.metric in LATENCY and rule.stat not in STATS:
            raise BadOption(f"--gate {rule.text!r} needs a statistic, one of {', '.join(STATS)}")
        if rule.metric not in LATENCY and rule.stat:
            raise BadOption(f"--gate metric {rule.metric!r} takes no statistic (got {rule.stat!r})")
    return rules


@dataclass(frozen=True, slots=True)
class Outcome:
    """One clause judged for one candidate: pass, fail or inconclusive, and the line that says so."""

    label: str
    judgement: noise.Judgement
    line: str


def _count(run: Run, metric: str, slos: tuple[Slo, ...]) -> noise.RunCount:
    """The requests a share or rate counts (meeting the SLO, succeeding, or failing) of one run."""
    m = run.measures
    if metric in ("goodput", "goodput_fraction"):
        good = goodput(m, slos).good
    else:
        good = int(m.ok.sum()) if metric == "requests_per_s" else int((~m.ok).sum())
    return noise.RunCount(good, m.n, m.duration_s)


def figure(
    group: list[Run], clause: GateRule, slos: tuple[Slo, ...], resamples: int, rng: np.random.Generator
) -> tuple[float, np.ndarray]:
    """A candidate's figure and its bootstrap draws over runs, then requests (report.noise): rates
    and shares pooled over the runs, a latency statistic the mean over runs of each run's value."""
    if clause.metric not in LATENCY:
        counts = [_count(r, clause.metric, slos) for r in group]
        if clause.metric in ("goodput", "requests_per_s"):
            return noise.pooled_rate(counts), noise.goodput_draws(counts, resamples, rng)
        total = sum(c.total for c in counts)
        share = sum(c.good for c in counts) / total if total else math.nan
        return share, noise.share_draws(counts, resamples, rng)
    values = [pooled_values(r.measures, clause.metric) for r in group]
    if clause.stat == "mean":
        per_run = [float(np.nanmean(v)) if np.isfinite(v).any() else math.nan for v in values]
        return float(np.mean(per_run)), noise.mean_draws(values, resamples, rng)
    q = 1.0 if clause.stat == "max" else int(clause.stat[1:]) / 100
    return float(np.mean(noise.run_quantiles(values, q))), noise.quantile_draws(values, q, resamples, rng)


def judge(
    base: list[Run],
    candidate: list[Run],
    clause: GateRule,
    slos: tuple[Slo, ...],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> Outcome:
    """The clause as a ratio candidate / BASE with its interval; it fails only when the whole
    interval is on the wrong side of the factor and passes only when the whole interval keeps it."""
    rng = np.random.default_rng(seed)
    label, name = candidate[0].label, base[0].label
    reference, base_draws = figure(base, clause, slos, resamples, rng)
    value, draws = figure(candidate, clause, slos, resamples, rng)
    unit = UNITS.get(clause.metric, " ms")
    runs = (
        f"{len(candidate)} and {len(base)} runs" if len(base) != len(candidate) else f"{len(base)} runs each"
    )
    runs = "1 run each" if runs == "1 runs each" else runs
    if min(len(base), len(candidate)) < 2:
        runs += ": run-to-run noise unknown"
    if not (math.isfinite(value) and math.isfinite(reference)):
        return Outcome(
            label, "fail", f"{label} {clause.text}: not measured (BASE {name} {reference:.4g}{unit})"
        )
    op = OPERATORS[clause.op]
    if reference > 0:
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = noise.interval(value / reference, draws / base_draws)
        said = f"{ratio.estimate:.3g}x {name}'s {reference:.4g}{unit}, {_ci(ratio)}"
        judged = noise.judge(ratio, lambda x: op(x, clause.threshold))
    else:  # BASE is 0 (e.g. no errors): the limit is 0 whatever the factor
        own = noise.interval(value, draws)
        said = f"{value:.4g}{unit}, {_ci(own)}, against {name}'s 0"
        judged = noise.judge(own, lambda x: op(x, 0.0))
    crossed = "below" if clause.op in (">=", ">") else "above" if clause.op in ("<=", "<") else "off"
    where = {"pass": "meets", "fail": f"is {crossed}", "inconclusive": "straddles"}[judged]
    return Outcome(label, judged, f"{label} {clause.text}: {said} {where} {clause.threshold:g} ({runs})")


def evaluate(
    runs: list[Run],
    clauses: tuple[GateRule, ...],
    base: str,
    slos: tuple[Slo, ...],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> list[Outcome]:
    """Every clause judged for every candidate the verdict compares, other than the base."""
    groups = pool(runs)
    labels = [g[0].label for g in groups]
    if base not in labels:
        raise BadOption(f"--gate-base {base!r} is not a candidate; candidates: {', '.join(labels) or 'none'}")
    if any(c.metric.startswith("goodput") for c in clauses) and not slos:
        raise BadOption("--gate on goodput needs --slo")
    reference = groups[labels.index(base)]
    return [
        judge(reference, group, clause, slos, resamples=resamples, seed=seed)
        for group in groups
        if group[0].label != base
        for clause in clauses
    ]


def _ci(i: Interval) -> str:
    return f"95% CI [{i.low:.3g}, {i.high:.3g}]"
