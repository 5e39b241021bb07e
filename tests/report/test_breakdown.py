"""Breakdowns by input length, endpoint and 10 s window (replayproxy/report/breakdown.py), from
result files with known values: each group's requests, errors and latency."""

from __future__ import annotations

from pathlib import Path

import pytest

from replayproxy.report.breakdown import by_endpoint, by_input_length, by_window
from replayproxy.report.measures import Measures
from replayproxy.report.runs import load_runs
from tests.report.helpers import result, write_run


def _measures(tmp_path: Path) -> Measures:
    """Six requests 4 s apart: prompts of 100, 2000 and 20000 tokens, one failed completion."""
    rows = [
        result(0, ttft_ms=10, prompt_tokens=100, sent_ms=0),
        result(1, ttft_ms=30, prompt_tokens=2000, sent_ms=4_000),
        result(2, ttft_ms=50, prompt_tokens=2000, sent_ms=8_000, endpoint="completions"),
        result(3, error="http_5xx", prompt_tokens=100, sent_ms=12_000, endpoint="completions"),
        result(4, ttft_ms=90, prompt_tokens=20000, sent_ms=16_000),
        result(5, ttft_ms=20, prompt_tokens=100, sent_ms=21_000),
    ]
    (run,) = load_runs([write_run(tmp_path / "a.rpr", rows)])
    return run.measures


def test_input_length_buckets_hold_only_their_requests(tmp_path: Path) -> None:
    groups = by_input_length(_measures(tmp_path))
    assert [(g.name, g.requests, g.errors) for g in groups] == [("<1k", 3, 1), ("1-4k", 2, 0), (">16k", 1, 0)]
    assert groups[0].ttft_ms.count == 2 and groups[0].ttft_ms.max == pytest.approx(
        20
    )  # the error is not timed
    assert groups[1].ttft_ms.p50 == pytest.approx(40)


def test_endpoints_and_windows_count_requests_and_their_arrival_rate(tmp_path: Path) -> None:
    m = _measures(tmp_path)
    assert [(g.name, g.requests, g.errors) for g in by_endpoint(m)] == [("chat", 4, 0), ("completions", 2, 1)]
    windows = by_window(m)
    assert [(g.name, g.requests, g.start_s) for g in windows] == [
        ("0s", 3, 0.0),
        ("10s", 2, 10.0),
        ("20s", 1, 20.0),
    ]
    assert windows[0].arrival_rate_per_s == pytest.approx(0.3) and windows[1].errors == 1
