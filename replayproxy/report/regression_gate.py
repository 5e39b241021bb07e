"""A regression gate for CI: `--gate "goodput>=0.95*BASE,ttft:p95<=1.10*BASE"` against a named run.

Re-run at every engine upgrade: each candidate other than the base must keep every clause, where
BASE is the base candidate's value of the same figure (the mean over its repetitions; goodput is
pooled). A failed gate is one line naming the candidate, the clause, both values and the limit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from replayproxy.errors import BadOption

GATE_METRICS = ("goodput", "goodput_fraction", "requests_per_s", "error_rate", "ttft", "tpot", "itl", "e2e")
LATENCY = ("ttft", "tpot", "itl", "e2e")
UNITS = {"goodput": " req/s", "requests_per_s": " req/s", "goodput_fraction": "", "error_rate": ""}
STATS = ("p50", "p90", "p95", "p99", "max", "mean")
_CLAUSE = re.compile(
    r"^(?P<metric>[a-z_]+)(?::(?P<stat>[a-z0-9]+))?(?P<op><=|>=)(?P<factor>[0-9]*\.?[0-9]+)\*base$"
)


@dataclass(frozen=True, slots=True)
class GateClause:
    metric: str
    stat: str  # for latency metrics: p50 ... mean; "" otherwise
    op: str  # "<=" or ">="
    factor: float

    @property
    def text(self) -> str:
        name = f"{self.metric}:{self.stat}" if self.stat else self.metric
        return f"{name}{self.op}{self.factor:g}*BASE"


def parse_gate(spec: str) -> tuple[GateClause, ...]:
    """Parse the gate spec; a ValueError names the clause and what is wrong."""
    clauses = []
    for raw in spec.split(","):
        text = raw.strip().replace(" ", "").lower()
        match = _CLAUSE.match(text)
        if match is None:
            raise BadOption(
                f"bad --gate clause {raw.strip()!r}; write e.g. 'goodput>=0.95*BASE,ttft:p95<=1.1*BASE'"
            )
        metric, stat = match["metric"], match["stat"] or ""
        if metric not in GATE_METRICS:
            raise BadOption(f"unknown --gate metric {metric!r}; valid: {', '.join(GATE_METRICS)}")
        if metric in LATENCY and stat not in STATS:
            raise BadOption(f"--gate clause {raw.strip()!r} needs a statistic, one of {', '.join(STATS)}")
        if metric not in LATENCY and stat:
            raise BadOption(f"--gate metric {metric!r} takes no statistic (got {stat!r})")
        clauses.append(GateClause(metric, stat, match["op"], float(match["factor"])))
    return tuple(clauses)


def value(doc: dict[str, Any], label: str, clause: GateClause) -> float:
    """The candidate's figure: the mean over its replay runs at the verdict's load (goodput pooled)."""
    if clause.metric in ("goodput", "goodput_fraction"):
        entry = next((c for c in doc["verdict"]["candidates"] if c["label"] == label), None)
        key = "goodput_requests_per_s" if clause.metric == "goodput" else "goodput_fraction"
        found = entry.get(key) if entry is not None else None
        return float(found) if found is not None else math.nan
    runs = [r for r in doc["runs"] if r["label"] == label and r["kind"] == "replay"]
    values = []
    for run in runs:
        if clause.metric == "error_rate":
            figure = run["errors"]["rate"]
        elif clause.metric == "requests_per_s":
            figure = run["requests_per_s"]
        else:
            figure = run[f"{clause.metric}_ms"][clause.stat]
        if figure is not None:
            values.append(float(figure))
    return sum(values) / len(values) if values else math.nan


def evaluate(doc: dict[str, Any], clauses: tuple[GateClause, ...], base: str) -> list[str]:
    """One line per broken clause per candidate; empty when the gate passes."""
    labels = [c["label"] for c in doc["verdict"]["candidates"]]
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
            limit = clause.factor * reference
            unit = UNITS.get(clause.metric, " ms")
            if not (math.isfinite(candidate) and math.isfinite(limit)):
                failures.append(f"{label} {clause.text}: not measured (BASE {base} {reference:.4g}{unit})")
                continue
            held = candidate <= limit if clause.op == "<=" else candidate >= limit
            if not held:
                failures.append(
                    f"{label} {clause.text}: {candidate:.4g}{unit} against a limit of {limit:.4g}{unit} "
                    f"({clause.factor:g} x {base}'s {reference:.4g}{unit})"
                )
    return failures
