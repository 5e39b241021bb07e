"""`replayproxy inspect`: print the workload profile of one or more traces, as text or JSON.

Damaged files are read as far as they go: the reader's warnings go to stderr and the profile
covers what could be read; the exit status is non-zero only when no request could be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from replayproxy.inspect import profile_of
from replayproxy.trace import load

EXAMPLES = (
    "replayproxy inspect traces/",
    "replayproxy inspect --json prod.rpt > profile.json",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="trace files, directories or globs")
    parser.add_argument(
        "--json", action="store_true", help="one JSON object with stable keys instead of text"
    )


def run(args: argparse.Namespace) -> int:
    columns = load(args.traces)
    for warning in columns.report.warnings:
        print(f"replayproxy inspect: warning: {warning}", file=sys.stderr)
    if not len(columns) and columns.report.warnings:
        print("replayproxy inspect: error: no request could be read", file=sys.stderr)
        return 1
    profile = profile_of(columns)
    print(json.dumps(profile, indent=2) if args.json else render_text(profile))
    return 0


def render_text(profile: dict[str, Any]) -> str:
    lines = [
        f"requests           {profile['requests']} in {profile['files']} file(s) "
        f"over {profile['duration_s']:.1f} s",
        f"rate               mean {_num(profile['rate_mean_rps'])} req/s, "
        f"peak {_num(profile['rate_peak_rps'])} req/s (per {profile['rate_peak_window_s']:g} s window), "
        f"inter-arrival CV {_num(profile['interarrival_cv'])}",
        f"input tokens       {_dist(profile['input_tokens'])}",
        f"output tokens      {_dist(profile['output_tokens'])}",
        f"streaming          {_share(profile['stream_share'])} of requests",
        f"endpoints          {_mix(profile['endpoints'], profile['requests'])}",
        f"models             {_mix(profile['models'], profile['requests'])}",
        f"prefix reuse       {_share(profile['prefix_reuse'])} of input tokens "
        "(infinite prefix cache hit rate)",
        f"sessions           {profile['sessions']}",
        f"peak concurrency   {_num(profile['peak_concurrency'])} (from recorded E2E times)",
        f"errors             {_mix(profile['errors'], profile['requests']) if profile['errors'] else 'none'}",
    ]
    if profile["ttft_ms"]["count"]:
        lines.append(f"recorded TTFT ms   {_dist(profile['ttft_ms'])}")
    if profile["e2e_ms"]["count"]:
        lines.append(f"recorded E2E ms    {_dist(profile['e2e_ms'])}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    if value is None:
        return "n/a"
    if float(value).is_integer() or abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _dist(summary: dict[str, Any]) -> str:
    if not summary["count"]:
        return "n/a"
    parts = [f"{name} {_num(summary[name])}" for name in ("p50", "p90", "p99", "max", "mean")]
    return ", ".join(parts) + f" (of {summary['count']})"


def _mix(counts: dict[str, int], total: int) -> str:
    shown = [
        f"{name or '(none)'} {count} ({100 * count / max(total, 1):.0f}%)"
        for name, count in list(counts.items())[:8]
    ]
    more = len(counts) - len(shown)
    return ", ".join(shown) + (f", and {more} more" if more > 0 else "")
