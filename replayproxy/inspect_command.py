"""`replayproxy inspect`: print the workload statistics of one or more traces, as text or JSON.

Damaged files are read as far as they go: the reader's warnings go to stderr and the statistics
cover what could be read; when no request could be read, that is one line (naming what was skipped), exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Literal

from replayproxy.trace import load, require_requests
from replayproxy.workload_stats import Distribution, WorkloadStats, workload_stats

FIGURES: tuple[Literal["p50", "p90", "p99", "max", "mean"], ...] = ("p50", "p90", "p99", "max", "mean")

EXAMPLES = (
    "replayproxy inspect traces/",
    "replayproxy inspect --json prod.rpt > stats.json",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="trace files, directories or globs")
    parser.add_argument(
        "--json", action="store_true", help="one JSON object with stable keys instead of text"
    )


def run(args: argparse.Namespace) -> int:
    columns = load(args.traces)
    if columns.report.warnings:  # a file of headers only is statistics of nothing, not bad input
        require_requests(columns, args.traces)
    for warning in columns.report.warnings:
        print(f"replayproxy inspect: warning: {warning}", file=sys.stderr)
    stats = workload_stats(columns)
    print(json.dumps(stats, indent=2) if args.json else render_text(stats))
    return 0


def render_text(stats: WorkloadStats) -> str:
    lines = [
        f"requests           {stats['requests']} in {stats['files']} file(s) "
        f"over {stats['duration_s']:.1f} s",
        f"rate               mean {_num(stats['rate_mean_rps'])} req/s, "
        f"peak {_num(stats['rate_peak_rps'])} req/s (per {stats['rate_peak_window_s']:g} s window), "
        f"inter-arrival CV {_num(stats['interarrival_cv'])}",
        f"input tokens       {_dist(stats['input_tokens'])}",
        f"output tokens      {_dist(stats['output_tokens'])}",
        f"streaming          {_share(stats['stream_share'])} of requests",
        f"endpoints          {_mix(stats['endpoints'], stats['requests'])}",
        f"models             {_mix(stats['models'], stats['requests'])}",
        f"prefix reuse       {_share(stats['prefix_reuse'])} of input tokens "
        "(infinite prefix cache hit rate)",
        f"sessions           {stats['sessions']}",
        f"peak concurrency   {_num(stats['peak_concurrency'])} (from recorded E2E times)",
        f"errors             {_mix(stats['errors'], stats['requests']) if stats['errors'] else 'none'}",
    ]
    if stats["ttft_ms"]["count"]:
        lines.append(f"recorded TTFT ms   {_dist(stats['ttft_ms'])}")
    if stats["e2e_ms"]["count"]:
        lines.append(f"recorded E2E ms    {_dist(stats['e2e_ms'])}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    if value is None:
        return "n/a"
    if float(value).is_integer() or abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _dist(summary: Distribution) -> str:
    if not summary["count"]:
        return "n/a"
    parts = [f"{name} {_num(summary[name])}" for name in FIGURES]
    return ", ".join(parts) + f" (of {summary['count']})"


def _mix(counts: dict[str, int], total: int) -> str:
    shown = [
        f"{name or '(none)'} {count} ({100 * count / max(total, 1):.0f}%)"
        for name, count in list(counts.items())[:8]
    ]
    more = len(counts) - len(shown)
    return ", ".join(shown) + (f", and {more} more" if more > 0 else "")
