"""`replayproxy compare TRACE --target A=URL --target B=URL --repeat 3 --slo SPEC -o DIR`: the
measurement procedure for candidates, built in.

Glue: each candidate is prepared and warmed up as `replay` does (`open_candidate`), then the
measured runs go in rounds, A, B, A, B, ... (or each round shuffled with `--seed`): a cache reset,
then the same requests into `DIR/LABEL-runI.rpr`. A drift of the machine over the session then falls
on every candidate alike. The report of every run follows, with `--gate` judged as `report` does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from replayproxy import config
from replayproxy.errors import BadOption, user_file
from replayproxy.launch import proxy_in_front
from replayproxy.replay import arguments as replay_arguments
from replayproxy.replay import procedure, summary
from replayproxy.replay import run as replay_run
from replayproxy.replay.options import ReplayOptions
from replayproxy.report.produce import ReportOptions, produce

EXAMPLES = (
    "replayproxy compare prod.rpt --target old=http://10.0.0.1:8000 --target new=http://10.0.0.2:8000 "
    "--repeat 3 --slo 'ttft<=500ms,tpot<=50ms' -o runs/",
    "replayproxy compare prod.rpt --target A=http://127.0.0.1:8000 --target B=http://127.0.0.1:8001 "
    "--seed 7 --gate 'goodput>=0.95*BASE' --replay-args --model m --workers 2",
)
# What compare sets per candidate; given again through --replay-args it would silently win.
COMPARE_SET = ("--target", "--label", "-o", "--output", "--repeat", "--warmup", "--quiet", "--progress")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("traces", nargs="+", metavar="TRACE", help="trace file(s), directories or globs (.rpt)")
    add("--target", action="append", required=True, metavar="LABEL=URL", help="a candidate; give two or more")
    add("--repeat", type=int, default=3, metavar="K", help="measured runs of each candidate")
    add("--warmup", default="20", metavar="N|Ss", help="warm-up of each candidate before its first run")
    add(
        "--seed",
        type=int,
        metavar="N",
        help="shuffle the order within each round with this seed (default: the --target order)",
    )
    add("-o", "--output", required=True, metavar="DIR", help="directory of the result files (LABEL-runI.rpr)")
    add(
        "--slo",
        metavar="SPEC",
        help="goodput SLOs for the verdict, e.g. 'ttft<=500ms,tpot<=50ms' (default: none)",
    )
    add(
        "--gate",
        metavar="SPEC",
        help="regression gate as in `report`, e.g. 'goodput>=0.95*BASE' (default: none)",
    )
    add("--gate-base", metavar="LABEL", help="the candidate BASE stands for (default: the first)")
    add("--html", metavar="FILE", help="also write the HTML report (default: none)")
    add("--quiet", action="store_true", help="no progress lines")
    add("--api-key", metavar="KEY", help=config.API_KEY_HELP + "; sent to every candidate")
    add(
        "--replay-args",
        nargs=argparse.REMAINDER,
        default=[],
        metavar="OPTION",
        help="last on the line: everything after it goes to every candidate's replay, "
        "e.g. --replay-args --model m --workers 2 (default: none)",
    )


def candidate_options(args: argparse.Namespace) -> dict[str, ReplayOptions]:
    """Each candidate's replay options, read by replay's own parser, so every replay option works."""
    targets = config.labelled(args.target, "--target")
    if len(targets) < 2:
        raise BadOption("compare needs two or more --target LABEL=URL")
    if args.repeat < 1:
        raise BadOption(f"--repeat must be at least 1, got {args.repeat}")
    for arg in args.replay_args:
        if arg.split("=", 1)[0] in COMPARE_SET:
            raise BadOption(
                f"--replay-args must not set {arg.split('=', 1)[0]}: compare sets it per candidate"
            )
    parser = argparse.ArgumentParser(prog="replayproxy compare --replay-args", add_help=False)
    replay_arguments.add_arguments(parser)
    out = Path(args.output)
    options = {}
    for label, url in targets.items():
        argv = [*args.traces, "--target", url, "--label", label, "-o", str(out / f"{label}.rpr")]
        argv += ["--repeat", str(args.repeat), "--warmup", args.warmup, "--quiet", *args.replay_args]
        argv += ["--api-key", args.api_key] if args.api_key else []  # parsed here, in this process
        options[label] = replay_arguments.options_from_args(parser.parse_args(argv))
    return options


def run(args: argparse.Namespace) -> int:
    options = candidate_options(args)
    with user_file(args.output):
        Path(args.output).mkdir(parents=True, exist_ok=True)
    order = procedure.interleaved(list(options), args.repeat, args.seed)
    summaries = replay_run.run_loop(_measure_all(options, order, args.quiet))
    failed = 0
    for (label, repetition), facts in zip(order, summaries, strict=True):
        failure = summary.failure(facts, options[label].max_error_rate)
        if failure:
            output = procedure.output_for(options[label].output, repetition, args.repeat)
            print(f"replayproxy compare: {label}: {failure} (results in {output})", file=sys.stderr)
            failed = 1
    paths = [procedure.output_for(options[label].output, i, args.repeat) for label, i in order]
    code = produce(
        ReportOptions(tuple(paths), slo=args.slo, html=args.html, gate=args.gate, gate_base=args.gate_base)
    )
    return failed or code


async def _measure_all(
    options: dict[str, ReplayOptions], order: list[tuple[str, int]], quiet: bool
) -> list[summary.Summary]:
    """Prepare and warm up every candidate, then the measured runs in `order`; every plan is closed."""
    plans = {}
    try:
        for label, opts in options.items():
            plans[label] = await replay_run.open_candidate(opts)
        summaries = []
        for n, (label, repetition) in enumerate(order, 1):
            if not quiet:
                print(
                    f"replayproxy compare: run {n}/{len(order)}: {label}, repetition {repetition}",
                    file=sys.stderr,
                )
            summaries.append(
                await replay_run.measure(options[label], plans[label], repetition, "none", proxy_in_front)
            )
        return summaries
    finally:
        for plan in plans.values():
            plan.close()
