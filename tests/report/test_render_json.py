"""The report as JSON (replayproxy/report/render_json.py): typed sections in their published
layout, values that slipped into options made plain, and an unmeasured figure never written NaN."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest

from replayproxy.report.render_json import render_json


@dataclass(frozen=True)
class _Section:
    values: dict[int, str]

    def to_json(self) -> dict[str, object]:
        return {f"k{k}": v for k, v in self.values.items()}


def test_a_typed_section_is_written_as_its_to_json_says_nested_and_in_order() -> None:
    text = render_json({"outer": {"section": _Section({2: "b", 1: "a"})}, "after": 1})
    assert text.endswith("}\n") and '\n  "outer": {\n    "section": {\n      "k2": "b",' in text
    assert json.loads(text) == {"outer": {"section": {"k2": "b", "k1": "a"}}, "after": 1}


def test_numpy_scalars_sets_and_tuples_become_plain_values() -> None:
    parsed = json.loads(render_json({"n": np.int64(3), "f": np.float32(0.5), "s": {7}, "t": (1, 2)}))
    assert parsed == {"n": 3, "f": 0.5, "s": [7], "t": [1, 2]}


def test_nan_is_refused_rather_than_written() -> None:
    with pytest.raises(ValueError):
        render_json({"p99": math.nan})
