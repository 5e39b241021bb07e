"""The report document (replayproxy/report/document.py), read as the JSON it is published as
(schema replayproxy-report/1 in docs/report.md): figures computed from result files with known
values, errors counted by class and never dropped, comparisons between runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from replayproxy.report.document import SCHEMA, build_document
from replayproxy.report.goodput import parse_slo
from replayproxy.report.render_json import render_json
from replayproxy.report.runs import load_runs
from tests.report.helpers import result, write_run


def two_runs(tmp_path: Path) -> list[Any]:
    fast = [
        result(i, ttft_ms=10 + i, e2e_ms=100 + i, gaps_us=(1000, 2000), completion_tokens=3)
        for i in range(10)
    ]
    slow = [result(i, ttft_ms=50 + i, e2e_ms=300, gaps_us=(1000,), completion_tokens=2) for i in range(9)]
    slow.append(result(9, error="http_5xx"))
    write_run(tmp_path / "a.rpr", fast, label="fast")
    write_run(tmp_path / "b.rpr", slow, label="slow")
    return load_runs([tmp_path / "a.rpr", tmp_path / "b.rpr"])


def published(doc: dict[str, Any]) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(render_json(doc))
    return parsed


def test_each_run_carries_its_counts_latencies_and_errors(tmp_path: Path) -> None:
    doc = published(build_document(two_runs(tmp_path), resamples=50))
    assert doc["schema"] == SCHEMA and [r["label"] for r in doc["runs"]] == ["fast", "slow"]
    fast, slow = doc["runs"]
    assert fast["requests"] == fast["succeeded"] == 10 and fast["errors"]["count"] == 0
    assert fast["ttft_ms"]["p50"] == pytest.approx(14.5) and fast["ttft_ms"]["max"] == pytest.approx(19)
    assert fast["ttft_ms"]["count"] == 10 and fast["e2e_ms"]["mean"] == pytest.approx(104.5)
    assert slow["requests"] == 10 and slow["succeeded"] == 9
    assert slow["errors"] == {"count": 1, "rate": 0.1, "by_class": {"http_5xx": 1}}
    assert slow["ttft_ms"]["count"] == 9  # the failed request is counted, not timed
    assert fast["output_tokens"]["p50"] == 3 and slow["output_tokens"]["p50"] == 2
    assert fast["schedule_lag_ms"]["max"] == 0 and doc["slo"] is None


def test_two_runs_are_compared_and_one_run_each_is_said_to_leave_noise_unknown(tmp_path: Path) -> None:
    doc = published(build_document(two_runs(tmp_path), resamples=50))
    assert len(doc["comparisons"]) >= 1
    assert any("noise" in w for w in doc["verdict"]["warnings"])


def test_slos_give_goodput_per_run(tmp_path: Path) -> None:
    doc = published(
        build_document(two_runs(tmp_path), slos=parse_slo("ttft<=20ms"), slo_spec="ttft<=20ms", resamples=50)
    )
    assert doc["slo"]["spec"] == "ttft<=20ms"
    fast, slow = doc["runs"]
    assert fast["goodput"] is not None and slow["goodput"] is not None
    assert json.dumps(fast["goodput"]) != json.dumps(
        slow["goodput"]
    )  # every fast request meets it, no slow one


def test_the_document_is_plain_json_with_no_nan(tmp_path: Path) -> None:
    write_run(tmp_path / "a.rpr", [result(0, error="timeout")], label="all failed")
    text = render_json(build_document(load_runs([tmp_path / "a.rpr"]), resamples=10))
    run = json.loads(text)["runs"][0]
    assert run["succeeded"] == 0 and run["ttft_ms"]["count"] == 0 and "NaN" not in text
