"""Regression gates (`--gate "match>=0.95,json_valid>=99%"`): rules parsed once, checked per run.

One parser for every report: the caller names the metrics it can measure and supplies each
metric's values by run label. A rule holds when every run's value meets it; a metric nobody
measured fails the rule (a gate must not pass by having nothing to check).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
}
_RULE = re.compile(
    r"^\s*([a-z_][a-z0-9_]*)\s*(>=|<=|==|>|<)\s*([-+]?[0-9]*\.?[0-9]+(?:e[-+]?\d+)?)\s*(%?)\s*$"
)


@dataclass(frozen=True, slots=True)
class GateRule:
    metric: str
    op: str
    threshold: float
    text: str  # the rule as written, for messages

    def holds(self, value: float) -> bool:
        return OPERATORS[self.op](value, self.threshold)


def parse_gate(spec: str, metrics: Collection[str]) -> tuple[GateRule, ...]:
    """Rules from a comma-separated spec; an unknown metric or a malformed rule raises ValueError."""
    rules = []
    for part in spec.split(","):
        match = _RULE.match(part.lower())
        if not match:
            raise ValueError(
                f"--gate: cannot read {part.strip()!r}; expected METRIC>=NUMBER, e.g. match>=0.95"
            )
        metric, op, number, percent = match.groups()
        if metric not in metrics:
            raise ValueError(f"--gate: unknown metric {metric!r}; valid: {', '.join(sorted(metrics))}")
        threshold = float(number) / 100 if percent else float(number)
        rules.append(GateRule(metric, op, threshold, part.strip()))
    return tuple(rules)


def failed_rules(
    rules: Sequence[GateRule], values: Mapping[str, Sequence[tuple[str, float | None]]]
) -> list[str]:
    """One line per failed rule, naming the runs that miss it; empty when the gate passes."""
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
