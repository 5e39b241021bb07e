"""The comparison at a glance: one small panel per metric, each candidate's figure with its interval.

Small multiples (Tufte): the panels share the candidates' rows, so a reader runs an eye down one
metric or across one candidate. Intervals are the verdict's (report.noise: runs, then requests),
so a candidate whose bar overlaps another's is not clearly different on that metric.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from replayproxy.report import noise
from replayproxy.report.document_types import Document
from replayproxy.report.goodput import Slo, goodput
from replayproxy.report.plots import new_figure
from replayproxy.report.runs import Run, candidates
from replayproxy.report.stats import Interval

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RESAMPLES = 400  # enough for a drawn interval; the report's figures use --resamples
PANEL_METRICS: tuple[tuple[str, str, float], ...] = (  # title, Measures attribute, quantile
    ("TTFT p50 ms", "ttft_ms", 0.5),
    ("TTFT p99 ms", "ttft_ms", 0.99),
    ("TPOT p50 ms", "tpot_ms", 0.5),
    ("E2E p50 ms", "e2e_ms", 0.5),
    ("E2E p99 ms", "e2e_ms", 0.99),
)


def _quantile(attr: str, q: float) -> Callable[[list[Run], np.random.Generator], Interval]:
    def figure(group: list[Run], rng: np.random.Generator) -> Interval:
        runs = [getattr(r.measures, attr) for r in group]
        estimate = float(np.nanmean(noise.run_quantiles(runs, q)))
        return noise.interval(estimate, noise.quantile_draws(runs, q, RESAMPLES, rng))

    return figure


def _goodput(slos: tuple[Slo, ...]) -> Callable[[list[Run], np.random.Generator], Interval]:
    def figure(group: list[Run], rng: np.random.Generator) -> Interval:
        counts = []
        for run in group:
            g = goodput(run.measures, slos)
            counts.append(noise.RunCount(g.good, g.total, run.measures.duration_s))
        return noise.interval(noise.pooled_rate(counts), noise.goodput_draws(counts, RESAMPLES, rng))

    return figure


def comparison_panel(doc: Document, runs: list[Run]) -> Figure | None:
    """Goodput (with an SLO) and latency percentiles, a panel each, a row per candidate."""
    groups = [g for g in candidates(runs) if any(np.isfinite(r.measures.e2e_ms).any() for r in g)]
    if not groups:
        return None
    metrics: list[tuple[str, Callable[[list[Run], np.random.Generator], Interval]]] = []
    if doc["slo"] is not None:
        slos = tuple(Slo(c["metric"], c["limit_ms"], c["percentile"]) for c in doc["slo"]["clauses"])
        metrics.append(("goodput req/s", _goodput(slos)))
    metrics += [(title, _quantile(attr, q)) for title, attr, q in PANEL_METRICS]
    fig = new_figure(12, 1.2 + 0.38 * len(groups))
    axes = np.atleast_1d(fig.subplots(1, len(metrics), sharey=True, squeeze=False)[0])
    rng = np.random.default_rng(0)
    y = np.arange(len(groups))[::-1]
    names = [g[0].label + (f" ({len(g)} runs)" if len(g) > 1 else "") for g in groups]
    for ax, (title, figure) in zip(axes, metrics, strict=True):
        for k, (row, group) in enumerate(zip(y, groups, strict=True)):
            i = figure(group, rng)
            if not np.isfinite(i.estimate):
                continue
            low, high = (i.low, i.high) if np.isfinite(i.low) and np.isfinite(i.high) else (i.estimate,) * 2
            ax.errorbar(i.estimate, row, xerr=[[i.estimate - low], [high - i.estimate]], fmt="o",
                        color=f"C{k % 10}", capsize=3)  # fmt: skip
        ax.set_title(title, fontsize="medium")
        ax.grid(axis="x", alpha=0.3)
        ax.margins(x=0.15)
    axes[0].set_yticks(y, names)
    axes[0].set_ylim(-0.6, len(groups) - 0.4)
    return fig
