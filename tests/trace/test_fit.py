"""Values fitted to their column (replayproxy/trace/fit.py): clamped when a number, the field's
default when not, each change counted, so one bad value never fails a frame."""

from __future__ import annotations

import math

import pytest

from replayproxy.trace.fit import fit_coded, fit_number, fit_numbers, fit_ragged


@pytest.mark.parametrize(
    ("kind", "value", "fitted"),
    [
        ("i8", 2**70, 2**63 - 1),
        ("i8", -(2**70), -(2**63)),
        ("i8", 12.7, 12),
        ("i8", math.inf, 2**63 - 1),
        ("i8", -math.inf, -(2**63)),
        ("i8", math.nan, -1),
        ("i8", "12", -1),
        ("i8", True, -1),  # a bool is not a count
        ("u8", -3, 0),
        ("u8", 2**64, 2**64 - 1),
        ("b1", True, True),
        ("b1", 1, -1),
    ],
)
def test_a_number_is_clamped_and_anything_else_is_the_default(
    kind: str, value: object, fitted: object
) -> None:
    assert fit_number(kind, value, -1) == fitted


def test_only_changed_values_are_counted() -> None:
    assert fit_numbers("i8", [1, 2**64, "x", 3], 0) == ([1, 2**63 - 1, 0, 3], 2)


def test_coded_values_keep_what_msgpack_can_store() -> None:
    assert fit_coded("str", ["a", 5, "\ud800", "b"], "") == (["a", "", "", "b"], 2)
    fitted, changed = fit_coded("obj", [{"t": 1}, "not a map", {"ok": 1, "bad": object()}, {1: {2**70}}], {})
    assert fitted == [{"t": 1}, {}, {"ok": 1}, {}] and changed == 3


def test_ragged_numbers_are_clamped_and_a_non_number_empties_the_field() -> None:
    assert fit_ragged("ragged:u4", [1, 2**40, -5]) == [1, 2**32 - 1, 0]
    assert fit_ragged("ragged:u8", [2**64 + 1]) == [2**64 - 1]
    assert fit_ragged("ragged:u8", [1, "x"]) is None
    assert fit_ragged("ragged:u8", [True]) is None
    assert fit_ragged("ragged:u8", 5) is None  # type: ignore[arg-type]
