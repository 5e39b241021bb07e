"""`replayproxy report RESULT.rpr... [--baseline TRACE] [--slo SPEC] [--json|--markdown] [--html FILE]`.

Output-check results (CHECK.rpc, `--gate SPEC`) may come beside replay results; they go first.
"""

from __future__ import annotations

import argparse

from replayproxy.report.produce import RESAMPLES, SEED, ReportOptions, produce
from replayproxy.report.sweep import MAX_ERROR_RATE

EXAMPLES = (
    "replayproxy report vllm.rpr sglang.rpr --baseline traces/ --slo 'ttft<=500ms,tpot<=50ms'",
    "replayproxy report runs/ --json -o report.json",
    "replayproxy report vllm.rpr sglang.rpr --markdown --html report.html",
    "replayproxy report check.rpc --gate 'match>=0.95,json_valid>=99%'",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "results",
        nargs="+",
        metavar="RESULT",
        help="replay results (.rpr) and/or output-check results (.rpc): files, directories or globs",
    )
    parser.add_argument(
        "--baseline",
        nargs="+",
        metavar="TRACE",
        help="trace(s) whose recorded production timings become a column of their own (default: none)",
    )
    parser.add_argument(
        "--slo",
        metavar="SPEC",
        help="goodput SLOs, e.g. 'ttft<=500ms,tpot<=50ms,e2e:p99<=20s' (default: none)",
    )
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="every figure as one JSON object (docs/report.md)")
    fmt.add_argument("--markdown", action="store_true", help="tables in Markdown, for a PR or wiki page")
    parser.add_argument(
        "--html", metavar="FILE", help="also write a self-contained HTML report with plots (default: none)"
    )
    parser.add_argument(
        "-o", "--output", metavar="FILE", help="write the text/JSON/Markdown here (default: stdout)"
    )
    parser.add_argument(
        "--gate",
        metavar="SPEC",
        help="regression gate, e.g. 'goodput>=0.95*BASE,ttft:p95<=1.10*BASE' (replay results) or "
        "'match>=0.95,json_valid>=99%%' (check results): exit 1 when a candidate breaks it, 3 when a replay "
        "rule's interval straddles its limit (inconclusive: run more repetitions) (default: none)",
    )
    parser.add_argument(
        "--gate-base", metavar="LABEL", help="the run label BASE stands for (default: the first candidate)"
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="accept result files read only in part (truncated or damaged): the report covers what was "
        "read either way, and without this option the exit status is 2",
    )
    parser.add_argument("--resamples", type=int, default=RESAMPLES, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=SEED, help="bootstrap seed")
    parser.add_argument(
        "--max-error-rate",
        type=float,
        default=MAX_ERROR_RATE,
        help="error rate at which a sweep step counts as failing",
    )


def run(args: argparse.Namespace) -> int:
    return produce(
        ReportOptions(
            results=tuple(args.results),
            baseline=tuple(args.baseline or ()),
            slo=args.slo,
            json=args.json,
            markdown=args.markdown,
            html=args.html,
            output=args.output,
            gate=args.gate,
            gate_base=args.gate_base,
            allow_partial=args.allow_partial,
            resamples=args.resamples,
            seed=args.seed,
            max_error_rate=args.max_error_rate,
        )
    )
