"""One report, from result files to the text written and the exit status: what `report` does for
its command line and `compare` for the runs it has just measured, so both judge a gate alike.

Output-check results (.rpc) may come beside replay results (.rpr); they go first.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
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
RESAMPLES = 1000  # bootstrap resamples of every interval
SEED = 0  # bootstrap seed


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """What one report reads and how it is written; the names are `report`'s options."""

    results: tuple[str, ...]  # replay (.rpr) and output-check (.rpc) results: files, directories, globs
    baseline: tuple[str, ...] = ()  # traces whose recorded timings become a column of their own
    slo: str | None = None
    json: bool = False
    markdown: bool = False
    html: str | None = None  # also write the HTML report here
    output: str | None = None  # the text/JSON/Markdown goes here instead of stdout
    gate: str | None = None
    gate_base: str | None = None  # the run label BASE stands for (None: the first candidate)
    allow_partial: bool = False  # result files read only in part are no bad input
    resamples: int = RESAMPLES
    seed: int = SEED
    max_error_rate: float = MAX_ERROR_RATE


def produce(options: ReportOptions) -> int:
    """Write the report; the exit status: 0, 1 (a gate failed), 2 (damaged input), 3 (inconclusive)."""
    slos = parse_slo(options.slo) if options.slo else ()
    check_spec, replay_spec = check_report.split_gate(options.gate or "")
    gate_clauses = parse_replay_gate(replay_spec) if replay_spec else ()
    if options.resamples < 100:
        raise BadOption(f"--resamples must be at least 100, got {options.resamples}")
    check_share("--max-error-rate", options.max_error_rate)
    check_paths, replay_paths = check_report.split_inputs(options.results)
    gate = check_report.parse_check_gate(check_spec) if check_spec else ()
    if gate and not check_paths:
        raise BadOption("--gate rules without *BASE read output-check results (.rpc); none given")
    if gate_clauses and not replay_paths:
        raise BadOption("--gate rules with *BASE read replay results (.rpr); none given")
    checks = check_report.check_documents(check_paths, gate, check_spec) if check_paths else []
    if not replay_paths:
        if options.html or options.baseline:
            raise BadOption("--html and --baseline need replay results (.rpr); only check results given")
        _write(options, check_report.render_checks(checks, options.json, options.markdown))
        return _check_gate_line(checks)
    loaded = read_runs(replay_paths)
    runs = loaded.runs
    baseline = baseline_run(options.baseline) if options.baseline else None
    doc = build_document(
        runs,
        read_warnings=[*loaded.damaged, *loaded.duplicates],
        baseline=baseline,
        slos=slos,
        slo_spec=options.slo or "",
        resamples=options.resamples,
        seed=options.seed,
        max_error_rate=options.max_error_rate,
    )
    if options.html:
        from replayproxy.report.render_html import render_html  # matplotlib only when asked for

        html = render_html(doc, [*runs, *([baseline] if baseline else [])])
        with user_file(options.html):
            Path(options.html).write_text(html, encoding="utf-8")
    if options.json:
        text = render_json({**doc, "checks": checks} if checks else doc)
    else:
        width = WIDTH if options.output else text_width(sys.stdout)
        text = render_markdown(doc) if options.markdown else render_text(doc, width)
        if checks:
            text = check_report.render_checks(checks, False, options.markdown) + "\n" + text
    _write(options, text)
    code = 0
    if gate_clauses:
        labels = [c.label for c in doc["verdict"]["candidates"]]
        base = options.gate_base or (labels[0] if labels else "")
        code = _gate_line(
            evaluate(runs, gate_clauses, base, slos, resamples=options.resamples, seed=options.seed)
        )
    return _check_gate_line(checks) or _damage_line(loaded.damaged, options.allow_partial) or code


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


def _write(options: ReportOptions, text: str) -> None:
    if options.output:
        with user_file(options.output):
            Path(options.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
