"""Replay options (replayproxy/replay/options.py): the shared start time's format, where cache
counters are read, what a result file records, and the rules bad options break."""

from __future__ import annotations

import pytest

from replayproxy.replay.options import ReplayOptions, parse_start_at


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


def test_cache_counters_are_read_from_the_target_unless_told_otherwise() -> None:
    assert ReplayOptions(target="http://127.0.0.1:8000").cache_metrics_url == "http://127.0.0.1:8000/metrics"
    options = ReplayOptions(target="http://127.0.0.1:8000", scrape_metrics="http://127.0.0.1:9/m")
    assert options.cache_metrics_url == "http://127.0.0.1:9/m"
    options = ReplayOptions(target="http://127.0.0.1:8000", scrape_metrics="/engine/metrics")
    assert options.cache_metrics_url == "http://127.0.0.1:8000/engine/metrics"


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
        ({"prepare": "later"}, "prepare must be one of stream, upfront"),
        ({"prepare_window": 0}, "prepare window must be > 0"),
    ],
)
def test_bad_options_are_refused_with_the_rule(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplayOptions(**options)  # type: ignore[arg-type]
