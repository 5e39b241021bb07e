"""A regression gate for CI: `--gate "goodput>=0.95*BASE,ttft:p95<=1.10*BASE"` against a named run.

Re-run at every engine upgrade: each candidate other than the base must keep every clause, where
BASE is the base candidate's value of the same figure (the mean over its repetitions; goodput is
pooled). A failed gate is one line naming the candidate, the clause, both values and the limit.
Rules are read by the one `--gate` grammar (report/gate.py) that output-check gates use too.
"""

from __future__ import annotations

import math

from replayproxy.errors import BadOption
from replayproxy.report.document_types import Document, stat, summary_of
from replayproxy.report.gate import OPERATORS, GateRule
from replayproxy.report.gate import parse_gate as parse_rules

GATE_METRICS = ("goodput", "goodput_fraction", "requests_per_s", "error_rate", "ttft", "tpot", "itl", "e2e")
LATENCY = ("ttft", "tpot", "itl", "e2e")
UNITS = {"goodput": " req/s", "requests_per_s": " req/s", "goodput_fraction": "", "error_rate": ""}
STATS = ("p50", "p90", "p95", "p99", "max", "mean")


def parse_gate(spec: str) -> tuple[GateRule, ...]:
    """Replay rules in the one `--gate` grammar (report/gate.py), each a factor of BASE; latency
    figures name a statistic, the others none. A BadOption names the rule and what is wrong."""
    rules = parse_rules(spec, GATE_METRICS)
    for rule in rules:
        if not rule.relative:
            raise BadOption(
                f"--gate {rule.text!r}: a replay figure is compared with BASE; write e.g. "
                "'goodput>=0.95*BASE,ttft:p95<=1.1*BASE'"
            )
        if rule.metric in LATENCY and rule.stat not in STATS:
            raise BadOption(f"--gate {rule.text!r} needs a statistic, one of {', '.join(STATS)}")
        if rule.metric not in LATENCY and rule.stat:
            raise BadOption(f"--gate metric {rule.metric!r} takes no statistic (got {rule.stat!r})")
    return rules


def value(doc: Document, label: str, clause: GateRule) -> float:
    """The candidate's figure: the mean over its replay runs at the verdict's load (goodput pooled)."""
    if clause.metric in ("goodput", "goodput_fraction"):
        entry = next((c for c in doc["verdict"]["candidates"] if c.label == label), None)
        g = entry.goodput if entry is not None else None
        found = None if g is None else g.requests_per_s if clause.metric == "goodput" else g.fraction
        return float(found) if found is not None else math.nan
    runs = [r for r in doc["runs"] if r["label"] == label and r["kind"] == "replay"]
    values = []
    for run in runs:
        if clause.metric == "error_rate":
            figure = run["errors"]["rate"]
        elif clause.metric == "requests_per_s":
            figure = run["requests_per_s"]
        else:
            figure = stat(summary_of(run, f"{clause.metric}_ms"), clause.stat)
        if figure is not None:
            values.append(float(figure))
    return sum(values) / len(values) if values else math.nan


def evaluate(doc: Document, clauses: tuple[GateRule, ...], base: str) -> list[str]:
    """One line per broken clause per candidate; empty when the gate passes."""
    labels = [c.label for c in doc["verdict"]["candidates"]]
    if base not in labels:
        raise BadOption(f"--gate-base {base!r} is not a candidate; candidates: {', '.join(labels) or 'none'}")
    if any(c.metric.startswith("goodput") for c in clauses) and doc["slo"] is None:
        raise BadOption("--gate on goodput needs --slo")
    failures = []
    for label in labels:
        if label == base:
            continue
        for clause in clauses:
            reference, candidate = value(doc, base, clause), value(doc, label, clause)
            limit = clause.threshold * reference
            unit = UNITS.get(clause.metric, " ms")
            if not (math.isfinite(candidate) and math.isfinite(limit)):
                failures.append(f"{label} {clause.text}: not measured (BASE {base} {reference:.4g}{unit})")
                continue
            if not OPERATORS[clause.op](candidate, limit):
                failures.append(
                    f"{label} {clause.text}: {candidate:.4g}{unit} against a limit of {limit:.4g}{unit} "
                    f"({clause.threshold:g} x {base}'s {reference:.4g}{unit})"
                )
    return failures
