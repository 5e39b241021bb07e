"""`replayproxy report RESULT.rpr... [--baseline TRACE] [--slo SPEC] [--json|--markdown] [--html FILE]`.

Output-check results (CHECK.rpc, `--gate SPEC`) may come beside replay results; they go first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from replayproxy.errors import BadOption, user_file
from replayproxy.report.baseline import baseline_run
from replayproxy.report.checks import report as check_report
from replayproxy.report.checks.document_types import CheckDoc
from replayproxy.report.document import build_document
from replayproxy.report.goodput import parse_slo
from replayproxy.report.regression_gate import Outcome, evaluate, parse_replay_gate
from replayproxy.report.render_json import render_json
from replayproxy.report.render_text import WIDTH, render_markdown, render_text, text_width
from replayproxy.report.runs import read_runs
from replayproxy.report.sweep import MAX_ERROR_RATE, check_share

INCONCLUSIVE_EXIT = 3  # a replay gate's interval straddles its limit: neither passed nor failed
INCONCLUSIVE = "gate inconclusive, run more repetitions"

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
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument(
        "--max-error-rate",
        type=float,
        default=MAX_ERROR_RATE,
        help="error rate at which a sweep step counts as failing",
    )


def run(args: argparse.Namespace) -> int:
    slos = parse_slo(args.slo) if args.slo else ()
    check_spec, replay_spec = check_report.split_gate(args.gate or "")
    gate_clauses = parse_replay_gate(replay_spec) if replay_spec else ()
    if args.resamples < 100:
        raise BadOption(f"--resamples must be at least 100, got {args.resamples}")
    check_share("--max-error-rate", args.max_error_rate)
    check_paths, replay_paths = check_report.split_inputs(args.results)
    gate = check_report.parse_check_gate(check_spec) if check_spec else ()
    if gate and not check_paths:
        raise BadOption("--gate rules without *BASE read output-check results (.rpc); none given")
    if gate_clauses and not replay_paths:
        raise BadOption("--gate rules with *BASE read replay results (.rpr); none given")
    checks = check_report.check_documents(check_paths, gate, check_spec) if check_paths else []
    if not replay_paths:
        if args.html or args.baseline:
            raise BadOption("--html and --baseline need replay results (.rpr); only check results given")
        _write(args, check_report.render_checks(checks, args.json, args.markdown))
        return _check_gate_line(checks)
    loaded = read_runs(replay_paths)
    runs = loaded.runs
    baseline = baseline_run(args.baseline) if args.baseline else None
    doc = build_document(
        runs,
        read_warnings=[*loaded.damaged, *loaded.duplicates],
        baseline=baseline,
        slos=slos,
        slo_spec=args.slo or "",
        resamples=args.resamples,
        seed=args.seed,
        max_error_rate=args.max_error_rate,
    )
    if args.html:
        from replayproxy.report.render_html import render_html  # matplotlib only when asked for

        html = render_html(doc, [*runs, *([baseline] if baseline else [])])
        with user_file(args.html):
            Path(args.html).write_text(html, encoding="utf-8")
    if args.json:
        text = render_json({**doc, "checks": checks} if checks else doc)
    else:
        width = WIDTH if args.output else text_width(sys.stdout)
        text = render_markdown(doc) if args.markdown else render_text(doc, width)
        if checks:
            text = check_report.render_checks(checks, False, args.markdown) + "\n" + text
    _write(args, text)
    code = 0
    if gate_clauses:
        labels = [c.label for c in doc["verdict"]["candidates"]]
        base = args.gate_base or (labels[0] if labels else "")
        code = _gate_line(evaluate(runs, gate_clauses, base, slos, resamples=args.resamples, seed=args.seed))
    return _check_gate_line(checks) or _damage_line(loaded.damaged, args.allow_partial) or code


def _damage_line(damaged: list[str], allowed: bool) -> int:
    """One line on stderr for result files read only in part; exit 2 (bad input) unless allowed."""
    if not damaged or allowed:
        return 0
    more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
    print(
        f"replayproxy report: {damaged[0]}{more}; the report covers what was read "
        "(--allow-partial accepts it)",
        file=sys.stderr,
    )
    return 2


def _check_gate_line(checks: list[CheckDoc]) -> int:
    """One line on stderr when an output-check gate fails (exit 1), as for a replay gate."""
    failures = [f for doc in checks if (gate := doc.get("gate")) is not None for f in gate["failures"]]
    if not failures:
        return 0
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    print(f"replayproxy report: gate failed: {failures[0]}{more}", file=sys.stderr)
    return 1


def _gate_line(outcomes: list[Outcome]) -> int:
    """One line on stderr for a gate that is not passed; the exit status: 1 failed, 3 inconclusive."""
    for judgement, said, code in (
        ("fail", "gate failed", 1),
        ("inconclusive", INCONCLUSIVE, INCONCLUSIVE_EXIT),
    ):
        lines = [o.line for o in outcomes if o.judgement == judgement]
        if lines:
            more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
            print(f"replayproxy report: {said}: {lines[0]}{more}", file=sys.stderr)
            return code
    return 0


def _write(args: argparse.Namespace, text: str) -> None:
    if args.output:
        with user_file(args.output):
            Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
