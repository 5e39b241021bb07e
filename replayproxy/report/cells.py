"""The cells of report tables: the Table record and how numbers are written (formatting only)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MISSING = "\u2013"  # an en dash: not measured (never a zero)


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    key: str = ""  # machine name of the section, e.g. for HTML anchors
    keys: int = 1  # leading columns that name a row (left-aligned; repeated when a wide table is split)


def fmt(value: object) -> str:
    """Numbers for humans: an en dash for missing, integers plain, floats to about four significant digits."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        magnitude = abs(value)
        if magnitude >= 1000 or value == int(value) and magnitude >= 100:
            return f"{value:.0f}"
        if magnitude >= 100:
            return f"{value:.1f}"
        if magnitude >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def pct(value: float | None) -> str:
    return MISSING if value is None else f"{value * 100:.1f}%"
