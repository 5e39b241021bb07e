"""The report's sections as tables (replayproxy/report/sections.py): what each table shows for
result files with known values, and that sections without data stay out."""

from __future__ import annotations

from pathlib import Path

from replayproxy.report.cells import Table
from replayproxy.report.document import build_document
from replayproxy.report.goodput import parse_slo
from replayproxy.report.runs import load_runs
from replayproxy.report.sections import SECTIONS, report_tables
from tests.report.test_document import two_runs


def by_key(tables: list[Table]) -> dict[str, Table]:
    return {t.key: t for t in tables}


def row(table: Table, first: str) -> list[str]:
    return next(r for r in table.rows if r[0] == first)


def test_the_tables_show_each_run_side_by_side(tmp_path: Path) -> None:
    tables = by_key(report_tables(build_document(two_runs(tmp_path), resamples=50)))
    assert list(tables)[0] == "verdict" and tables["verdict"].notes  # the verdict's lines come first
    latency = tables["latency"]
    assert latency.header[:2] == ["metric", "stat"] and len(latency.header) == 4
    ttft = latency.rows[[r[0] for r in latency.rows].index("TTFT ms") :][:7]
    assert [r[1] for r in ttft] == ["p50", "p90", "p95", "p99", "max", "mean", "count"]
    assert ttft[0][2:] == ["14.50", "54.00"] and ttft[-1][2:] == ["10", "9"]
    throughput = tables["throughput"]
    assert row(throughput, "requests")[1:] == ["10", "10"] and row(throughput, "succeeded")[1:] == ["10", "9"]
    errors = tables["errors"]
    assert row(errors, "http_5xx")[1:] == ["0", "1"] and row(errors, "error rate")[2].endswith("(1)")


def test_sections_without_their_data_are_left_out(tmp_path: Path) -> None:
    keys = {t.key for t in report_tables(build_document(two_runs(tmp_path), resamples=50))}
    assert "goodput" not in keys and "sweep" not in keys and "sessions" not in keys
    with_slo = build_document(
        two_runs(tmp_path), slos=parse_slo("ttft<=20ms"), slo_spec="ttft<=20ms", resamples=50
    )
    assert "goodput" in {t.key for t in report_tables(with_slo)}


def test_report_tables_are_every_section_in_order(tmp_path: Path) -> None:
    doc = build_document(load_runs([two_runs(tmp_path)[0].paths[0]]), resamples=10)
    assert report_tables(doc) == [t for section in SECTIONS for t in section(doc)]
    assert all(isinstance(t, Table) and t.title and t.key for t in report_tables(doc))
