"""The Grafana dashboard loads and queries only metrics the proxy exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from replayproxy.proxy.metrics import METRICS

DASHBOARD = Path(__file__).resolve().parents[1] / "tools" / "grafana" / "replayproxy.json"


def _exported_series() -> set[str]:
    series: set[str] = set()
    for name, kind, _, _ in METRICS:
        if kind == "histogram":
            series.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            series.add(name)
    return series


def test_dashboard_is_valid_json_with_panels_and_queries() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"]
    targets = [t for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(dashboard["panels"]) >= 8 and all(t["expr"] for t in targets)


def test_dashboard_refers_only_to_exported_metrics_and_covers_recorder_health() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs.append(dashboard["templating"]["list"][1]["query"])
    used = {m for expr in exprs for m in re.findall(r"\breplayproxy_[a-z0-9_]+", expr)}
    assert used <= _exported_series(), used - _exported_series()
    for needed in (
        "replayproxy_records_written_total",
        "replayproxy_records_dropped_total",
        "replayproxy_recording_failing",
        "replayproxy_writer_queue_depth",
        "replayproxy_ttft_seconds_bucket",
        "replayproxy_tpot_seconds_bucket",
        "replayproxy_e2e_seconds_bucket",
        "replayproxy_requests_in_flight",
        "replayproxy_output_tokens_total",
    ):
        assert needed in used, needed
