"""The rate search's options (`sweep --auto` and `tune`, which searches each configuration the same
way), declared once so that the two commands cannot drift apart in names, types or defaults."""

from __future__ import annotations

import argparse

from replayproxy.report.sweep import ATTAINMENT, MAX_ERROR_RATE, MAX_RUNS, START_SPEED


def add_search_options(parser: argparse.ArgumentParser, searched: str, prefix: str = "") -> None:
    """`--max-runs`, `--start-speed`, `--max-error-rate` and `--attainment`; `searched` names what
    one search covers ("the search", "each configuration's search"), `prefix` marks the options
    that only the search reads (sweep: "--auto: ")."""
    add = parser.add_argument
    add(
        "--max-runs",
        type=int,
        default=MAX_RUNS,
        metavar="N",
        help=f"{prefix}most replays of {searched} (default: {MAX_RUNS})",
    )
    add(
        "--start-speed",
        type=float,
        default=START_SPEED,
        metavar="X",
        help=f"{prefix}first speed {searched} tries (default: {START_SPEED:g})",
    )
    add(
        "--max-error-rate",
        type=float,
        default=MAX_ERROR_RATE,
        metavar="R",
        help=f"a replay with this error rate or more fails (default: {MAX_ERROR_RATE:g})",
    )
    add(
        "--attainment",
        type=float,
        default=ATTAINMENT,
        metavar="F",
        help=f"{prefix}share of requests that must meet per-request SLOs (default: {ATTAINMENT:g})",
    )
