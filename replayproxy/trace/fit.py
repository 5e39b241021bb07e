"""Values fitted to their column: what a writer stores when a producer's value does not fit.

A column encodes a whole frame at once; one value it cannot hold (an integer past 64 bits, a NaN
in an integer column, a list where a string belongs) would otherwise fail the frame and every
record in it. Writers try the fast whole-column encoding first and call these only when it
failed: integers are clamped to the column's range, anything else is marked unknown (the field's
default), and the caller counts each value changed.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import msgpack

# The errors a column encoder raises for a value it cannot hold (struct.error: packing hashes).
UNFIT = (OverflowError, TypeError, ValueError, struct.error)

_RANGES = {"i8": (-(1 << 63), (1 << 63) - 1), "u8": (0, (1 << 64) - 1), "ragged:u8": (0, (1 << 64) - 1)}
_RANGES["ragged:u4"] = (0, (1 << 32) - 1)
_packb = msgpack.Packer(use_bin_type=True).pack


def fit_number(kind: str, value: Any, default: Any) -> Any:
    """`value` as the numeric column `kind` can hold it: a number clamped, anything else `default`."""
    if kind == "b1":
        return value if isinstance(value, bool) else default
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return default
    low, high = _RANGES[kind]
    if isinstance(value, float) and math.isinf(value):
        return high if value > 0 else low
    return min(max(int(value), low), high)


def fit_numbers(kind: str, values: Sequence[Any], default: Any) -> tuple[list[Any], int]:
    """A numeric column's values fitted one by one, and how many were changed."""
    fitted = [fit_number(kind, v, default) for v in values]
    return fitted, sum(1 for a, b in zip(values, fitted, strict=True) if a is not b)


def fit_coded(kind: str, values: Sequence[Any], default: Any) -> tuple[list[Any], int]:
    """A dictionary-coded column's values that msgpack can store: strings for `str`, maps of
    packable entries for `obj` (an entry that cannot be stored is left out); and the changes."""
    fitted: list[Any] = []
    changed = 0
    for value in values:
        fit = _fit_text(value, default) if kind == "str" else _fit_map(value, default)
        changed += fit is not value
        fitted.append(fit)
    return fitted, changed


def _fit_text(value: Any, default: Any) -> Any:
    if not isinstance(value, str):
        return default
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return default
    return value


def _fit_map(value: Any, default: Any) -> Any:
    if not isinstance(value, dict):
        return default
    try:
        _packb(value)
    except UNFIT:
        kept = {k: v for k, v in value.items() if _packable(k) and _packable(v)}
        return kept or default
    return value


def _packable(value: Any) -> bool:
    try:
        _packb(value)
    except UNFIT:
        return False
    return True


def fit_ragged(kind: str, values: Sequence[Any]) -> list[int] | None:
    """A ragged field's numbers clamped to the column's item range; None when it holds a non-number
    (the field is then stored empty, i.e. unknown)."""
    try:
        items = list(values)
    except TypeError:
        return None
    low, high = _RANGES[kind]
    fitted = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int):
            return None
        fitted.append(min(max(item, low), high))
    return fitted
