"""Regression gates (`--gate "match>=0.95,json_valid>=99%"`): rules parsed once, checked per run.

One grammar for every report: `METRIC[:STAT] OP NUMBER[%|*BASE]`, with OP one of >= <= > < ==.
`95%` is 0.95; `*BASE` makes the number a factor of a base run's value of the same figure (a
relative rule, for replay figures such as `ttft:p95<=1.1*BASE`); STAT picks a statistic of a
distribution. The caller names the metrics it can measure and evaluates what its figures allow;
absolute rules are evaluated here: a rule holds when every run's value meets it, and a metric
nobody measured fails the rule (a gate must not pass by having nothing to check).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from replayproxy.errors import BadOption

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
}
_RULE = re.compile(
    r"^(?P<metric>[a-z_][a-z0-9_]*)(?::(?P<stat>[a-z0-9]+))?(?P<op>>=|<=|==|>|<)"
    r"(?P<number>[-+]?[0-9]*\.?[0-9]+(?:e[-+]?\d+)?)(?P<suffix>%|\*base)?$"
)


@dataclass(frozen=True, slots=True)
class GateRule:
    metric: str
    op: str
    threshold: float  # a factor of the base run's value when `relative`
    text: str  # the rule as written, for messages
    stat: str = ""  # e.g. "p95" for a distribution's statistic
    relative: bool = False  # written `*BASE`

    def holds(self, value: float) -> bool:
        return OPERATORS[self.op](value, self.threshold)


def parse_gate(spec: str, metrics: Collection[str]) -> tuple[GateRule, ...]:
    """Rules from a comma-separated spec; an unknown metric or a malformed rule raises ValueError."""
    rules = []
    for part in spec.split(","):
        match = _RULE.match("".join(part.split()).lower())
        if not match:
            raise BadOption(
                f"--gate: cannot read {part.strip()!r}; expected METRIC>=NUMBER, e.g. match>=0.95"
            )
        metric, suffix = match["metric"], match["suffix"] or ""
        if metric not in metrics:
            raise BadOption(f"--gate: unknown metric {metric!r}; valid: {', '.join(sorted(metrics))}")
        number = float(match["number"])
        threshold = number / 100 if suffix == "%" else number
        rules.append(
            GateRule(metric, match["op"], threshold, part.strip(), match["stat"] or "", suffix == "*base")
        )
    return tuple(rules)


def failed_rules(
    rules: Sequence[GateRule], values: Mapping[str, Sequence[tuple[str, float | None]]]
) -> list[str]:
    """One line per failed absolute rule, naming the runs that miss it; empty when the gate passes."""
    failures = []
    for rule in rules:
        measured = [(label, v) for label, v in values.get(rule.metric, ()) if v is not None]
        if not measured:
            failures.append(f"{rule.text}: not measured")
            continue
        missed = [f"{label} {value:.4g}" for label, value in measured if not rule.holds(value)]
        if missed:
            failures.append(f"{rule.text}: " + ", ".join(missed))
    return failures
