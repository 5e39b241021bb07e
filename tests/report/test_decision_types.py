"""The typed sections whose published layout differs from their attributes (report/decision_types.py):
a comparison's per-metric and per-quantile keys and a verdict candidate's goodput keys are written
exactly as docs/report.md names them, in that order, through render_json."""

from __future__ import annotations

import json

from replayproxy.report.decision_types import (
    CandidateDoc,
    CandidateGoodput,
    ComparisonDoc,
    IntervalDoc,
    MetricComparisonDoc,
    QuantileComparisonDoc,
)
from replayproxy.report.render_json import render_json


def _metric(pairs: int) -> MetricComparisonDoc:
    interval: IntervalDoc = {"estimate": -5.0, "ci95_low": -7.0, "ci95_high": -3.0}
    return MetricComparisonDoc(
        pairs=pairs,
        median_ratio_b_over_a=0.5,
        share_faster_b=None,
        quantiles={
            50: QuantileComparisonDoc(interval, {"a": 1.0, "b": None}, "B is faster"),
            99: QuantileComparisonDoc(interval, {"a": None, "b": None}, "no clear difference"),
        },
    )


def test_a_comparison_is_published_with_a_key_per_metric_and_per_quantile() -> None:
    comparison = ComparisonDoc("A", "B", 2, 1, "unknown", 10, 1, 0, {"ttft": _metric(9), "e2e": _metric(8)})
    published = json.loads(render_json({"comparisons": [comparison]}))["comparisons"][0]
    assert list(published) == [
        "a", "b", "runs_a", "runs_b", "run_to_run_noise", "common_requests", "only_a", "only_b", "ttft", "e2e"
    ]  # fmt: skip
    assert list(published["ttft"]) == [
        "pairs", "median_ratio_b_over_a", "share_faster_b", "p50_diff_ms", "p99_diff_ms",
        "p50_run_spread_ms", "p99_run_spread_ms", "p50_verdict", "p99_verdict",
    ]  # fmt: skip
    assert published["e2e"]["pairs"] == 8 and published["ttft"]["share_faster_b"] is None
    assert published["ttft"]["p50_diff_ms"] == {"estimate": -5.0, "ci95_low": -7.0, "ci95_high": -3.0}
    assert published["ttft"]["p50_run_spread_ms"] == {"a": 1.0, "b": None}
    assert published["ttft"]["p99_verdict"] == "no clear difference"


def test_a_candidate_has_goodput_keys_only_with_an_slo() -> None:
    without = CandidateDoc("A", 1, None, 12.5)
    with_slo = CandidateDoc("B", 2, CandidateGoodput(3.5, 0.7, (3.0, 4.0), 200), 11.0)
    one_run = CandidateDoc("C", 1, CandidateGoodput(None, None, None, 0), None)
    published = json.loads(render_json({"candidates": [without, with_slo, one_run]}))["candidates"]
    assert published[0] == {"label": "A", "runs": 1, "ttft_p50_ms": 12.5}
    assert list(published[1]) == [
        "label", "runs", "goodput_requests_per_s", "goodput_fraction", "goodput_run_range", "requests",
        "ttft_p50_ms",
    ]  # fmt: skip
    assert published[1]["goodput_run_range"] == [3.0, 4.0] and published[1]["requests"] == 200
    assert published[2]["goodput_run_range"] is None and published[2]["goodput_requests_per_s"] is None
