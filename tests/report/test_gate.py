"""--gate rules: parsing, percentages, which runs miss a rule, and that nothing measured fails."""

from __future__ import annotations

import pytest

from replayproxy.report.gate import failed_rules, parse_gate

METRICS = ("match", "json_valid", "error_rate")


def test_parse_rules_and_percentages() -> None:
    rules = parse_gate("match>=0.95, json_valid >= 99%,error_rate<0.01", METRICS)
    assert [(r.metric, r.op, r.threshold) for r in rules] == [
        ("match", ">=", 0.95),
        ("json_valid", ">=", 0.99),
        ("error_rate", "<", 0.01),
    ]


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("match=>1", "cannot read 'match=>1'"),
        ("speed>=1", "unknown metric 'speed'; valid: error_rate"),
        ("match>=", "cannot read"),
        ("", "cannot read"),
    ],
)
def test_bad_rules(spec: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_gate(spec, METRICS)


def test_statistics_and_relative_rules_parse() -> None:
    (rule,) = parse_gate("ttft:p95 <= 1.1*BASE", ("ttft",))
    assert (rule.metric, rule.stat, rule.op, rule.threshold, rule.relative) == (
        "ttft",
        "p95",
        "<=",
        1.1,
        True,
    )
    (plain,) = parse_gate("match>=1", METRICS)
    assert plain.stat == "" and not plain.relative


def test_failures_name_the_runs() -> None:
    rules = parse_gate("match>=0.95,json_valid>=1,error_rate<=0", METRICS)
    values = {"match": [("B", 0.41), ("C", 0.99)], "json_valid": [("A", None)], "error_rate": [("A", 0.0)]}
    assert failed_rules(rules, values) == ["match>=0.95: B 0.41", "json_valid>=1: not measured"]
    assert failed_rules(parse_gate("match>0.4", METRICS), values) == []
