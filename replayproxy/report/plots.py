"""Plots for the HTML report, drawn with matplotlib (optional extra `[report]`) into inline SVG.

matplotlib is imported only here, only when a plot is drawn. Each plot is a function
(doc, runs) -> Figure | None listed in PLOTS, so a new section (e.g. telemetry over time) is one
more entry. Data are reduced before drawing (quantile grids, binned medians, samples), so a run of
10^6 requests gives a small file.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from replayproxy.errors import BadOption
from replayproxy.report import telemetry
from replayproxy.report.document_types import Document
from replayproxy.report.goodput import Slo, goodput
from replayproxy.report.measures import in_flight_series
from replayproxy.report.plot_axes import readable
from replayproxy.report.runs import Run
from replayproxy.report.stats import grouped_summaries

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CDF_POINTS = 400
SCATTER_POINTS = 3000
MAX_TIME_PANELS = 8


class MissingDependency(BadOption):
    """An optional dependency the asked-for output needs is not installed."""


def new_figure(width: float, height: float) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise MissingDependency("--html needs matplotlib: pip install 'replayproxy[report]'") from e
    return Figure(figsize=(width, height), layout="constrained")


def to_svg(fig: Figure) -> str:
    """The figure as inline SVG with readable axes (report.plot_axes); its size follows the page (CSS)."""
    import matplotlib

    readable(fig)
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "replayproxy"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg") :]


def legend(ax: Any, **options: Any) -> None:
    """A legend only where something was drawn (matplotlib warns about an empty one)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", **options)


CDF_FIGURES = (
    ("TTFT", "ttft_ms", "share of requests"),
    ("TPOT", "tpot_ms", "share of requests"),
    ("E2E", "e2e_ms", "share of requests"),
    ("ITL", "itl_ms", "share of gaps"),
    ("schedule lag", "lag_ms", "share of requests"),
)


def latency_cdfs(doc: Document, runs: list[Run]) -> Figure | None:
    """TTFT, TPOT, E2E, ITL and the replayer's own schedule lag, one CDF panel each."""
    fig = new_figure(12, 6.8)
    axes = fig.subplots(2, 3).ravel()
    levels = np.linspace(0, 1, CDF_POINTS)
    for ax, (name, attr, share) in zip(axes, CDF_FIGURES, strict=False):
        for run in runs:
            values = getattr(run.measures, attr)
            values = values[np.isfinite(values) & (values > 0)]
            if len(values):
                ax.plot(np.quantile(values, levels), levels, label=run.name)
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} ms (log)")
        ax.set_ylabel(share)
        ax.set_title(f"{name} CDF")
        ax.grid(alpha=0.3)
    axes[-1].set_axis_off()
    legend(axes[0])
    return fig


GOODPUT_SCALES = np.geomspace(0.25, 4.0, 17)  # the SLO's limits times these


def goodput_vs_slo(doc: Document, runs: list[Run]) -> Figure | None:
    """Goodput as the SLO is tightened or relaxed: every per-request limit scaled by one factor."""
    slo = doc["slo"]
    clauses = [c for c in slo["clauses"] if c["percentile"] is None] if slo is not None else []
    if not clauses:
        return None
    fig = new_figure(12, 3.4)
    ax = fig.subplots()
    for run in runs:
        rates = []
        for scale in GOODPUT_SCALES:
            scaled = tuple(Slo(c["metric"], c["limit_ms"] * scale) for c in clauses)
            rates.append(goodput(run.measures, scaled).requests_per_s)
        ax.plot(GOODPUT_SCALES, rates, marker=".", label=run.name)
    ax.axvline(1.0, color="grey", linestyle=":", label=f"the SLO ({slo['spec'] if slo else ''})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("SLO limits x factor (log)")
    ax.set_ylabel("goodput req/s")
    ax.set_title("Goodput against the SLO (every per-request limit scaled)")
    ax.grid(alpha=0.3)
    legend(ax)
    return fig


def _bins(run: Run) -> tuple[np.ndarray, int, float]:
    m = run.measures
    width = max(1.0, float(np.ceil(m.duration_s / 60.0)))
    ids = np.floor(m.start_s / width).astype(np.int64)
    return ids, int(ids.max()) + 1 if len(ids) else 0, width


def latency_over_time(doc: Document, runs: list[Run]) -> Figure | None:
    shown = runs[:MAX_TIME_PANELS]
    fig = new_figure(12, 2.6 * len(shown))
    # One y range for every panel, so a slower run looks slower at a glance.
    axes = np.atleast_1d(fig.subplots(len(shown), 1, squeeze=False, sharey=True)[:, 0])
    for ax, run in zip(axes, shown, strict=True):
        ids, n, width = _bins(run)
        t = np.arange(n) * width
        for attr, name in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E")):
            sums = grouped_summaries(ids, getattr(run.measures, attr), n)
            ax.plot(t, [s.p50 for s in sums], label=f"{name} p50")
            ax.plot(t, [s.p95 for s in sums], linestyle="--", label=f"{name} p95")
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
        ax.set_title(f"{run.name}: latency by send time ({width:g} s bins) and arrival rate")
        ax.grid(alpha=0.3)
        rate = ax.twinx()
        rate.step(
            t,
            np.bincount(ids, minlength=n) / width,
            where="post",
            color="grey",
            alpha=0.6,
            label="arrivals/s",
        )
        rate.set_ylabel("arrivals/s")
        legend(ax, loc="upper left")
    axes[-1].set_xlabel("s since the run's first send")
    return fig


def in_flight(doc: Document, runs: list[Run]) -> Figure | None:
    fig = new_figure(12, 3.2)
    ax = fig.subplots()
    for run in runs:
        t, count = in_flight_series(run.measures)
        ax.step(t, count, where="post", label=run.name)
    ax.set_xlabel("s since the run's first send")
    ax.set_ylabel("requests in flight")
    ax.set_title("In-flight requests over time")
    ax.grid(alpha=0.3)
    legend(ax)
    return fig


def ttft_by_input(doc: Document, runs: list[Run]) -> Figure | None:
    if not any(np.isfinite(r.measures.input_tokens).any() for r in runs):
        return None
    fig = new_figure(12, 3.8)
    ax = fig.subplots()
    rng = np.random.default_rng(0)
    for k, run in enumerate(runs):
        m = run.measures
        color = f"C{k % 10}"
        keep = np.flatnonzero(np.isfinite(m.input_tokens) & np.isfinite(m.ttft_ms) & (m.input_tokens > 0))
        if not len(keep):
            continue
        sample = rng.choice(keep, size=min(len(keep), SCATTER_POINTS), replace=False)
        ax.scatter(m.input_tokens[sample], m.ttft_ms[sample], s=4, alpha=0.3, color=color)
        edges = np.geomspace(m.input_tokens[keep].min(), m.input_tokens[keep].max() + 1, 16)
        ids = np.digitize(m.input_tokens[keep], edges) - 1
        medians = [s.p50 for s in grouped_summaries(ids, m.ttft_ms[keep], len(edges) - 1)]
        ax.plot(
            np.sqrt(edges[:-1] * edges[1:]),
            medians,
            color=color,
            label=f"{run.name} median",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("input tokens (log)")
    ax.set_ylabel("TTFT ms (log)")
    ax.set_title("TTFT by input length")
    ax.grid(alpha=0.3)
    legend(ax)
    return fig


def sweep_curves(doc: Document, runs: list[Run]) -> Figure | None:
    sweeps = doc["sweeps"]
    if not sweeps:
        return None
    fig = new_figure(12, 3.6 * len(sweeps))
    grid = fig.subplots(len(sweeps), 2, squeeze=False)
    for (left, right), sweep in zip(grid, sweeps, strict=True):
        closed = sweep["closed_loop"]
        loads = [s["concurrency_limit"] if closed else s["offered_requests_per_s"] for s in sweep["steps"]]
        speeds = [np.nan if load is None else load for load in loads]
        left.plot(speeds, [s["requests_per_s"] for s in sweep["steps"]], marker="o", label="achieved req/s")
        if any(s["goodput"] for s in sweep["steps"]):
            left.plot(
                speeds,
                [g["requests_per_s"] if (g := s["goodput"]) else None for s in sweep["steps"]],
                marker="s",
                label="goodput req/s",
            )
        right.plot(speeds, [s["ttft_ms"]["p95"] for s in sweep["steps"]], marker="o", label="TTFT p95")
        right.plot(speeds, [s["e2e_ms"]["p95"] for s in sweep["steps"]], marker="^", label="E2E p95")
        right.set_yscale("log")
        left.set_ylabel("req/s")
        right.set_ylabel("ms (log)")
        point = sweep["operating_point"]
        for ax, title in ((left, "throughput and goodput vs load"), (right, "p95 latency vs load")):
            if point is not None:
                at = point["concurrency_limit"] if closed else point["offered_requests_per_s"]
                if at is not None:
                    ax.axvline(at, color="red", linestyle=":", label=f"operating point ({point['load']})")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("requests in flight (closed loop, log)" if closed else "offered req/s (log)")
            ax.set_title(f"{sweep['target']}: {title}")
            ax.grid(alpha=0.3)
            legend(ax)
    return fig


TELEMETRY_SERIES = (
    ("kv_usage", "KV cache usage (0-1)"),
    ("running", "requests running"),
    ("waiting", "requests waiting"),
)


def engine_telemetry(doc: Document, runs: list[Run]) -> Figure | None:
    """The engine's gauges over the run, one panel per gauge, one line per run."""
    records = [(run, run.extras["telemetry"][0]) for run in runs if run.extras.get("telemetry")]
    if not records:
        return None
    fig = new_figure(12, 2.6 * len(TELEMETRY_SERIES))
    axes = fig.subplots(len(TELEMETRY_SERIES), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, title) in zip(axes, TELEMETRY_SERIES, strict=True):
        for run, record in records:
            series = telemetry.over_time(record, name)
            if series is not None:
                ax.step(*series, where="post", label=run.name)
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        legend(ax, loc="upper left")
    axes[0].set_title("Engine telemetry over time (from the target's /metrics)")
    axes[-1].set_xlabel("s since the run's start")
    return fig


PLOTS: list[tuple[str, Callable[[Document, list[Run]], Figure | None]]] = [
    ("Latency CDFs", latency_cdfs),
    ("Goodput against the SLO", goodput_vs_slo),
    ("Latency over time", latency_over_time),
    ("In-flight requests", in_flight),
    ("TTFT by input length", ttft_by_input),
    ("Sweep", sweep_curves),
    ("Engine telemetry", engine_telemetry),
]
