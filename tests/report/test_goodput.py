"""SLO parsing and a hand-worked goodput example."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replayproxy.report.goodput import Slo, SloError, goodput, parse_slo, request_values
from replayproxy.report.runs import load_runs
from tests.report.helpers import result, write_run


def test_parse_units_and_percentiles() -> None:
    assert parse_slo("ttft<=500ms, tpot<=50ms,e2e<=20s,itl<=250us") == (
        Slo("ttft", 500.0),
        Slo("tpot", 50.0),
        Slo("e2e", 20_000.0),
        Slo("itl", 0.25),
    )
    assert parse_slo("ttft:p95<=800ms,E2E:p99.9<=1.5s") == (
        Slo("ttft", 800.0, 95.0),
        Slo("e2e", 1500.0, 99.9),
    )
    assert Slo("ttft", 800.0, 95.0).text == "ttft:p95<=800ms"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ttft<=500", "missing unit"),
        ("ttft<=500min", "unknown unit 'min'"),
        ("ttfb<=500ms", "unknown SLO metric 'ttfb'"),
        ("ttft>500ms", "needs '<='"),
        ("ttft:95<=500ms", "bad percentile"),
        ("ttft:p0<=500ms", "percentile must be within"),
        ("ttft<=500ms,", "empty SLO clause"),
        ("ttft<=fast", "bad limit"),
    ],
)
def test_parse_errors_are_one_clear_line(spec: str, message: str) -> None:
    with pytest.raises(SloError, match=message) as info:
        parse_slo(spec)
    assert "\n" not in str(info.value)


def test_hand_worked_goodput(tmp_path: Path) -> None:
    ten = [0] * 9  # 10 output tokens -> 9 gaps (values irrelevant for TPOT)
    results = [
        result(0, sent_ms=0, ttft_ms=100, e2e_ms=1000, completion_tokens=10, gaps_us=ten),  # TPOT 100: misses
        result(
            1, sent_ms=1000, ttft_ms=100, e2e_ms=500, completion_tokens=10, gaps_us=ten
        ),  # TPOT 44.4: good
        result(
            2, sent_ms=2000, ttft_ms=600, e2e_ms=700, completion_tokens=10, gaps_us=ten
        ),  # TTFT 600: misses
        result(3, sent_ms=3000, error="timeout", e2e_ms=100),  # failed: not good, still counted
        result(4, sent_ms=4000, ttft_ms=200, e2e_ms=380, completion_tokens=10, gaps_us=ten),  # TPOT 20: good
    ]
    m = load_runs([write_run(tmp_path / "r.rpr", results)])[0].measures
    g = goodput(m, parse_slo("ttft<=500ms,tpot<=50ms,ttft:p50<=150ms,e2e:p90<=600ms"))
    assert (g.good, g.total) == (2, 5)
    assert g.fraction == pytest.approx(0.4)
    assert g.requests_per_s == pytest.approx(2 / 4.38)  # run: first send 0 s -> last end 4.38 s
    ttft_p50, e2e_p90 = g.checks
    assert ttft_p50.value_ms == pytest.approx(150.0) and ttft_p50.met  # median of 100, 100, 200, 600
    assert e2e_p90.value_ms == pytest.approx(np.percentile([1000, 500, 700, 380], 90)) and not e2e_p90.met
    assert not g.percentiles_met and g.per_request


def test_one_token_reply_meets_tpot_but_missing_ttft_misses(tmp_path: Path) -> None:
    results = [
        result(0, completion_tokens=1, ttft_ms=5, e2e_ms=5),
        result(1, completion_tokens=3, gaps_us=[1, 1]),
    ]
    m = load_runs([write_run(tmp_path / "r.rpr", results)])[0].measures
    m.ttft_ms[1] = np.nan  # e.g. a server that never sent a content chunk
    g = goodput(m, parse_slo("ttft<=1s,tpot<=1ms,itl<=1ms"))
    assert g.good == 1


def test_itl_request_value_is_the_worst_gap(tmp_path: Path) -> None:
    results = [result(0, gaps_us=[1000, 9000, 2000]), result(1, gaps_us=[3000]), result(2)]
    m = load_runs([write_run(tmp_path / "r.rpr", results)])[0].measures
    worst = request_values(m, "itl")
    assert worst[0] == 9.0 and worst[1] == 3.0 and np.isnan(worst[2])
