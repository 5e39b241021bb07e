"""Telemetry summaries checked against hand-worked numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayproxy.cli import main
from replayproxy.report.telemetry import histogram_quantiles, over_time, summarize
from replayproxy.results import ReplayResult, ResultWriter, RunHeader

HIST = {"buckets": [[0.1, 4.0], [1.0, 9.0], [float("inf"), 10.0]], "count": 10.0, "sum": 3.5}


def test_histogram_quantiles_are_buckets_and_the_mean_is_sum_over_count() -> None:
    q = histogram_quantiles(HIST, None, (0.5, 0.9, 0.95))
    assert q is not None
    # p50: rank 5 falls in (0.1, 1.0] holding observations 5..9; no value inside it is made up.
    assert q.buckets[50] == (100.0, 1000.0)
    assert q.buckets[90] == (100.0, 1000.0)
    assert q.buckets[95] == (1000.0, None)  # in +Inf: only the lower bound is known
    assert set(q.buckets) == {50, 90, 95}
    assert q.count == 10.0
    assert q.mean == pytest.approx(350.0)  # 3.5 s over 10 observations, exact
    published = q.to_json()
    assert published["p50_bucket"] == [100.0, 1000.0] and "p50" not in published


def test_histogram_quantiles_use_only_the_runs_observations() -> None:
    start = {"buckets": [[0.1, 4.0], [1.0, 4.0], [float("inf"), 4.0]], "count": 4.0, "sum": 0.2}
    q = histogram_quantiles(HIST, start, (0.5,))
    assert q is not None and q.count == 6.0
    # 6 new observations: 5 in (0.1, 1.0], 1 in +Inf, 3.3 s between them.
    assert q.buckets[50] == (100.0, 1000.0)
    assert q.mean == pytest.approx(3300.0 / 6)
    assert histogram_quantiles(HIST, HIST, (0.5,)) is None


def test_summary_of_gauges_counters_and_waiting_time() -> None:
    samples = [
        {
            "t_ns": 0,
            "kv_usage": 0.2,
            "waiting": 0.0,
            "preemptions": 5.0,
            "prefix_queries": 100.0,
            "prefix_hits": 10.0,
        },
        {
            "t_ns": 1_000_000_000,
            "kv_usage": 0.9,
            "waiting": 3.0,
            "preemptions": 7.0,
            "prefix_queries": 300.0,
            "prefix_hits": 90.0,
        },
        {
            "t_ns": 3_000_000_000,
            "kv_usage": 0.4,
            "waiting": 0.0,
            "preemptions": 8.0,
            "prefix_queries": 500.0,
            "prefix_hits": 110.0,
        },
    ]
    record = {"source": "u", "samples": samples, "histograms_start": {}, "histograms_end": {"ttft_s": HIST}}
    summary = summarize(record, requests=200).figures
    assert summary["kv_usage_peak"] == 0.9
    assert summary["kv_usage_mean"] == pytest.approx(0.5)
    assert summary["waiting_time_share"] == pytest.approx(2 / 3)  # waiting from t=1 s to t=3 s of 3 s
    assert summary["preemptions"] == 3.0
    assert summary["preemptions_per_1k_requests"] == pytest.approx(15.0)
    assert summary["prefix_hit_rate"] == pytest.approx(100 / 400)
    assert summarize(record, requests=200).engine_latency_ms["ttft"].buckets[50] == (100.0, 1000.0)
    times, values = over_time(record, "kv_usage") or ((), ())
    assert list(times) == [0.0, 1.0, 3.0] and list(values) == [0.2, 0.9, 0.4]


def test_counter_reset_and_missing_metrics() -> None:
    samples = [
        {"t_ns": 0, "preemptions": 10.0},
        {"t_ns": 1, "preemptions": 2.0},
        {"t_ns": 2, "preemptions": 5.0},
    ]
    summary = summarize({"samples": samples}, requests=0).figures
    assert summary["preemptions"] == 5.0  # restart to 2, then +3
    assert summary["preemptions_per_1k_requests"] is None
    assert "kv_usage_peak" not in summary and "prefix_hit_rate" not in summary


def _run_with_telemetry(path: Path, label: str, kv: float) -> str:
    header = RunHeader(label=label, target="http://127.0.0.1:1", start_wall_ns=1)
    samples = [
        {"t_ns": i * 500_000_000, "kv_usage": kv * i / 4, "waiting": float(i % 2), "running": 3.0}
        for i in range(5)
    ]
    with ResultWriter(path, header) as writer:
        for i in range(20):
            result = ReplayResult(
                index=i,
                scheduled_ns=i * 10**8,
                sent_ns=i * 10**8,
                status=200,
                ttft_ns=50_000_000,
                e2e_ns=200_000_000,
                content_chunks=5,
                completion_tokens=5,
                expected_output_tokens=5,
            )
            writer.write(result)
        telemetry = {
            "source": "u",
            "samples": samples,
            "histograms_start": {},
            "histograms_end": {"ttft_s": HIST},
            "found": {"kv_usage": "vllm:kv_cache_usage_perc"},
        }
        writer.write_extra("telemetry", telemetry)
        writer.write_extra("trace_profile", {"prefix_reuse": 0.42})
    return str(path)


def test_report_shows_engine_telemetry_beside_client_latency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _run_with_telemetry(tmp_path / "a.rpr", "engine-a", 0.8)
    b = _run_with_telemetry(tmp_path / "b.rpr", "engine-b", 0.4)
    assert main(["report", a, b, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["telemetry"]["kv_usage_peak"] for r in doc["runs"]] == [0.8, 0.4]
    assert doc["runs"][0]["trace_prefix_reuse"] == 0.42
    assert doc["runs"][0]["telemetry"]["engine_ttft_ms"]["mean"] == pytest.approx(350.0)
    assert main(["report", a, b]) == 0
    text = capsys.readouterr().out
    assert "Engine telemetry" in text and "KV cache usage peak" in text and "80.0%" in text
    assert "TTFT mean ms: engine / client" in text and "350 / 50" in text.replace(".0 /", " /")
    # The engine's percentile is a bucket range on a row of its own, never "engine / client".
    assert "TTFT p50 ms: engine bucket" in text and "100..1000" in text
    assert "p50 ms: engine / client" not in text
