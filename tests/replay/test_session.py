"""Run preparation helpers (replayproxy/replay/session.py), through its public functions: the
shared start time, the speed that gives a request rate, where cache counters are read, and the
digest that names the replayed trace in every result file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from replayproxy import clock
from replayproxy.replay.session import (
    ReplayOptions,
    cache_metrics_url,
    parse_start_at,
    speed_for_rate,
    start_ns_for,
    trace_digest,
)


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("1700000000", 1_700_000_000 * 10**9),
        ("1700000000.5", 1_700_000_000_500_000_000),
        ("2023-11-14T22:13:20Z", 1_700_000_000 * 10**9),
        ("2023-11-14T22:13:20", 1_700_000_000 * 10**9),  # naive means UTC
        ("2023-11-14T23:13:20+01:00", 1_700_000_000 * 10**9),
    ],
)
def test_start_at_takes_unix_seconds_or_iso_times(text: str, ns: int) -> None:
    assert parse_start_at(text) == ns


def test_a_start_at_that_is_neither_says_what_it_takes() -> None:
    with pytest.raises(ValueError, match="unix seconds or an ISO 8601 time, got 'tomorrow'"):
        parse_start_at("tomorrow")


def test_start_ns_is_soon_by_default_in_the_future_when_asked_and_never_in_the_past() -> None:
    before = clock.now_ns()
    assert start_ns_for(ReplayOptions()) > before
    in_a_minute = (clock.wall_ns() + 60 * 10**9) / 1e9
    start = start_ns_for(ReplayOptions(start_at=f"{in_a_minute:.3f}"))
    assert 55 * 10**9 < start - before < 65 * 10**9  # monotonic, through the wall-clock anchor
    with pytest.raises(ValueError, match="is in the past"):
        start_ns_for(ReplayOptions(start_at="1700000000"))


def test_the_speed_for_a_rate_spreads_the_window_over_its_requests() -> None:
    offsets = np.array([0, 2, 10], np.int64) * 10**9  # 3 requests over 10 s: 0.2 req/s at speed 1
    assert speed_for_rate(offsets, 1.0) == pytest.approx(5.0)
    assert speed_for_rate(offsets, 0.1) == pytest.approx(0.5)
    for degenerate in (np.array([5], np.int64), np.array([7, 7], np.int64), np.array([], np.int64)):
        with pytest.raises(ValueError, match="two requests at different times"):
            speed_for_rate(degenerate, 1.0)


def test_cache_counters_are_read_from_the_target_unless_told_otherwise() -> None:
    assert cache_metrics_url(ReplayOptions(target="http://127.0.0.1:8000")) == "http://127.0.0.1:8000/metrics"
    options = ReplayOptions(target="http://127.0.0.1:8000", scrape_metrics="http://127.0.0.1:9/m")
    assert cache_metrics_url(options) == "http://127.0.0.1:9/m"
    options = ReplayOptions(target="http://127.0.0.1:8000", scrape_metrics="/engine/metrics")
    assert cache_metrics_url(options) == "http://127.0.0.1:8000/engine/metrics"


def test_the_options_a_result_file_records_leave_the_api_key_out() -> None:
    recorded = ReplayOptions(
        target="http://127.0.0.1:8000", api_key="sk-secret", traces=("a.rpt",)
    ).recorded()
    assert "api_key" not in recorded and "sk-secret" not in repr(recorded)
    assert recorded["traces"] == ["a.rpt"] and recorded["target"] == "http://127.0.0.1:8000"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speed": 0}, "speed must be > 0"),
        ({"max_error_rate": 2}, "max error rate must be between 0 and 1"),
        ({"repeat": 0}, "repeat must be >= 1"),
        ({"progress": "loud"}, "progress must be one of"),
        ({"sample_sessions": 0.0}, "sample-sessions must be in"),
    ],
)
def test_bad_options_are_refused_with_the_rule(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplayOptions(**options)  # type: ignore[arg-type]


def test_the_trace_digest_covers_every_file_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "b.rpt").write_bytes(b"second")
    (tmp_path / "a.rpt").write_bytes(b"first")
    expected = hashlib.sha256(b"firstsecond").hexdigest()
    assert trace_digest([str(tmp_path)]) == expected
    assert trace_digest([str(tmp_path / "a.rpt"), str(tmp_path / "b.rpt")]) == expected
    (tmp_path / "b.rpt").write_bytes(b"changed")
    assert trace_digest([str(tmp_path)]) != expected
