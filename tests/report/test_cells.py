"""How report cells write numbers (replayproxy/report/cells.py): a dash for missing, never a zero."""

from __future__ import annotations

import math

from replayproxy.report.cells import MISSING, fmt, pct


def test_missing_values_are_a_dash_not_a_zero() -> None:
    assert fmt(None) == fmt(math.nan) == fmt(math.inf) == pct(None) == MISSING
    assert fmt(0) == "0" and fmt(0.0) == "0" and pct(0.0) == "0.0%"


def test_numbers_keep_about_four_significant_digits() -> None:
    assert [fmt(v) for v in (12345.6, 250.0, 123.45, 12.345, 0.012345)] == [
        "12346",
        "250",
        "123.5",
        "12.35",
        "0.0123",
    ]
    assert fmt(7) == "7" and fmt(True) == "yes" and fmt(False) == "no" and fmt("vllm") == "vllm"
    assert pct(0.1234) == "12.3%"
