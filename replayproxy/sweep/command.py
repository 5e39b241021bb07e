"""`replayproxy sweep TRACE --target URL (--speeds 0.5,1,2,4 | --rates 5,10,20 | --concurrency 1,4,16 |
--auto --slo SPEC) [-o DIR] [--replay-args ...]`: the operating line of one engine on one trace.

Each step is a separate `python -m replayproxy replay ... --speed X -o DIR/speed-X.rpr --quiet`
(report must not import replay: feature packages meet only through result files), so every step's
results stay on disk for `replayproxy report DIR/*.rpr`. Absolute rates become speeds through the
trace's own mean rate; a concurrency step is a closed loop: every request is due at once and
`--max-concurrency N` releases the next one as one ends.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from replayproxy import children, config
from replayproxy.errors import BadInputFile, BadOption
from replayproxy.report.document import build_document, sweep_doc
from replayproxy.report.goodput import Slo, parse_slo
from replayproxy.report.render_json import render_json
from replayproxy.report.render_text import format_markdown, format_text, text_width
from replayproxy.report.runs import Run, load_runs
from replayproxy.report.sections import sweep_section
from replayproxy.report.sweep import Step, auto_search, check_search_options, meets, step_of
from replayproxy.sweep.options import add_search_options
from replayproxy.sweep.steps import replay_command, run_replay, step_path
from replayproxy.trace import load, require_requests

EXAMPLES = (
    "replayproxy sweep prod.rpt --target http://127.0.0.1:8000 --speeds 0.5,1,2,4 --slo 'ttft<=500ms'",
    "replayproxy sweep prod.rpt --target http://127.0.0.1:8000 --auto --slo 'ttft<=500ms,tpot<=50ms'",
    "replayproxy sweep prod.rpt --target http://127.0.0.1:8000 --speeds 1,2 --replay-args --model m",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", nargs="+", metavar="TRACE", help="trace file(s) to replay at each speed")
    parser.add_argument("--target", required=True, metavar="URL", help="base URL of the engine under test")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--speeds", metavar="LIST", help="comma-separated speeds, e.g. 0.5,1,2,4 (default: none; or --auto)"
    )
    how.add_argument(
        "--rates", metavar="LIST", help="comma-separated offered rates in req/s, e.g. 5,10,20 (default: none)"
    )
    how.add_argument(
        "--concurrency",
        metavar="LIST",
        help="closed loop: requests in flight per step, e.g. 1,2,4,8,16 (default: none)",
    )
    how.add_argument("--auto", action="store_true", help="search the highest speed meeting --slo")
    parser.add_argument(
        "--slo",
        metavar="SPEC",
        help="SLOs, e.g. 'ttft<=500ms,tpot<=50ms'; required with --auto (default: none)",
    )
    parser.add_argument("-o", "--output-dir", default="sweep", metavar="DIR", help="where the steps' .rpr go")
    add_search_options(parser, "the search", prefix="--auto: ")
    parser.add_argument(
        "--progress",
        choices=PROGRESS,
        default="auto",
        help="each step's progress line every 10 s on stderr (auto, log) or none",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines (--progress none)")
    parser.add_argument("--api-key", metavar="KEY", help=config.API_KEY_HELP)
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the whole report as JSON")
    fmt.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument(
        "--replay-args",
        nargs=argparse.REMAINDER,
        default=[],
        metavar="OPTION",
        help="last on the line: everything after it goes to every `replayproxy replay`, "
        "e.g. --replay-args --model m --max-concurrency 64 (default: none)",
    )


CLOSED_LOOP_SPEED = 1e6  # every request due at once: the concurrency limit alone paces the run
# Options the sweep sets itself, per step; given again through --replay-args they would override it.
SWEEP_SET = ("--speed", "--request-rate", "-o", "--output")


def parse_speeds(text: str, option: str = "--speeds") -> list[float]:
    try:
        speeds = sorted({float(s) for s in text.split(",") if s.strip()})
    except ValueError as e:
        raise BadOption(f"{option} must be numbers separated by commas, got {text!r}") from e
    if not speeds or speeds[0] <= 0 or not math.isfinite(speeds[-1]):
        raise BadOption(f"{option} must be positive numbers, got {text!r}")
    return speeds


def parse_concurrency(text: str) -> list[int]:
    values = parse_speeds(text, "--concurrency")
    if any(v != int(v) for v in values):
        raise BadOption(f"--concurrency must be whole numbers, got {text!r}")
    return [int(v) for v in values]


def refuse_conflicts(args: argparse.Namespace) -> None:
    """--replay-args must not set what the sweep sets per step (it would silently win)."""
    taken = SWEEP_SET + (("--max-concurrency",) if args.concurrency else ())
    for arg in args.replay_args:
        name = arg.split("=", 1)[0]
        if name in taken:
            raise BadOption(
                f"--replay-args must not set {name}: the sweep sets each step's load and output "
                "(use --speeds, --rates or --concurrency, and -o DIR)"
            )


def trace_rate(paths: Sequence[str]) -> float:
    """The trace's own mean arrival rate (req/s), which a speed of 1 replays."""
    offsets = load(paths).offset_ns
    if len(offsets) < 2 or offsets.max() <= offsets.min():
        raise BadInputFile("--rates needs a trace of at least two requests at different times")
    return float(len(offsets) / ((offsets.max() - offsets.min()) / 1e9))


PROGRESS = ("auto", "log", "none")


def run(args: argparse.Namespace) -> int:
    with children.signals_interrupt():  # SIGTERM/SIGHUP stop the step's replay as Ctrl-C does
        return _sweep(args)


def _sweep(args: argparse.Namespace) -> int:
    slos: tuple[Slo, ...] = parse_slo(args.slo) if args.slo else ()
    if args.auto and not slos:
        raise BadOption("--auto needs --slo (the target the search must meet)")
    check_search_options(args.max_runs, args.start_speed, args.max_error_rate, args.attainment)
    refuse_conflicts(args)
    steps_asked: list[tuple[float, str, float, tuple[str, ...]]] = []  # (speed, kind, value, extra args)
    rates = parse_speeds(args.rates, "--rates") if args.rates else []
    if args.speeds:
        steps_asked = [(s, "speed", s, ()) for s in parse_speeds(args.speeds)]
    elif args.concurrency:
        steps_asked = [
            (CLOSED_LOOP_SPEED, "concurrency", c, ("--max-concurrency", str(c)))
            for c in parse_concurrency(args.concurrency)
        ]
    # a missing, damaged or empty trace fails here, not in the first replay step
    require_requests(load(args.trace, fields=("offset_ns",)), args.trace)
    if rates:
        base = trace_rate(args.trace)
        steps_asked = [(r / base, "rate", r, ()) for r in rates]
    directory = Path(args.output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    speeds: dict[str, float] = {}  # path -> speed asked for, in case the header lacks options.speed

    def one_step(speed: float, kind: str = "speed", value: float = 0.0, extra: tuple[str, ...] = ()) -> Step:
        path = step_path(directory, value or speed, kind)
        what = {"speed": f"{speed:g}x", "rate": f"{value:g} req/s", "concurrency": f"concurrency {value:g}"}
        print(f"sweep: replaying at {what[kind]} -> {path}", file=sys.stderr, flush=True)
        run_replay(replay_command(args, speed, path, *extra), config.api_key_environment(args.api_key))
        speeds[str(path)] = speed
        step = step_of(_with_speed(load_runs([path]), speeds)[0], slos)
        print(
            f"sweep: {what[kind]}: {step.requests_per_s:.3g} req/s achieved, "
            f"TTFT p95 {step.ttft_ms.p95:.4g} ms, errors {step.error_rate:.1%}",
            file=sys.stderr,
            flush=True,
        )
        return step

    best: float | None = None
    if args.auto:
        _, best = auto_search(
            one_step,
            lambda s: meets(s, args.max_error_rate, args.attainment),
            start=args.start_speed,
            max_runs=args.max_runs,
        )
    else:
        for speed, kind, value, extra in steps_asked:
            one_step(speed, kind, value, extra)
    runs = sorted(
        _with_speed(load_runs(list(speeds)), speeds), key=lambda r: (r.concurrency_limit, r.speed or 0.0)
    )
    doc = build_document(runs, slos=slos, slo_spec=args.slo or "", max_error_rate=args.max_error_rate)
    doc["sweeps"] = [sweep_doc(runs, slos, args.max_error_rate, best, args.attainment)]
    if args.json:
        sys.stdout.write(render_json(doc))
    else:
        section = sweep_section(doc)
        sys.stdout.write(
            format_markdown(section) if args.markdown else format_text(section, text_width(sys.stdout))
        )
    return 0


def _with_speed(runs: list[Run], speeds: dict[str, float]) -> list[Run]:
    for run in runs:
        run.options.setdefault("speed", speeds[run.paths[0]])
    return runs
