"""Figures that once came out wrong: TPOT of whole-body replies, a trace without timings, labels."""

from __future__ import annotations

import json
import math
import re
from itertools import count
from pathlib import Path

import pytest

from replayproxy.cli import main
from replayproxy.report import gpu
from replayproxy.report.baseline import baseline_run
from replayproxy.report.cells import MISSING
from replayproxy.report.document import build_document
from replayproxy.report.goodput import parse_slo
from replayproxy.report.runs import load_runs
from replayproxy.report.sections import report_tables
from replayproxy.results import ResultWriter, RunHeader
from replayproxy.shape import RequestShape
from replayproxy.trace import TraceHeader, write_trace
from tests.report.helpers import result, write_run


def _mixed_run(path: Path) -> Path:
    """Two streaming replies (20 ms per token after the first) and two whole-body replies."""
    return write_run(
        path,
        [
            result(0, ttft_ms=10, e2e_ms=190, completion_tokens=10, gaps_us=[20_000] * 9),
            result(1, ttft_ms=10, e2e_ms=190, completion_tokens=10, gaps_us=[20_000] * 9),
            result(2, ttft_ms=300, e2e_ms=300, completion_tokens=10, stream=False),
            result(3, ttft_ms=300, e2e_ms=300, completion_tokens=10, stream=False),
        ],
        label="mixed",
    )


def test_tpot_covers_only_streaming_replies_of_two_tokens_or_more(tmp_path: Path) -> None:
    runs = load_runs([_mixed_run(tmp_path / "r.rpr")])
    m = runs[0].measures
    assert list(m.tpot_ms[:2]) == [pytest.approx(20.0)] * 2
    assert all(math.isnan(v) for v in m.tpot_ms[2:])  # a whole-body reply has no TPOT (not 0)
    doc = build_document(runs)
    tpot = doc["runs"][0]["tpot_ms"]
    assert tpot["p50"] == pytest.approx(20.0) and tpot["count"] == 2
    window = doc["runs"][0]["breakdowns"]["window_10s"][0]
    assert window["tpot_ms"]["p50"] == pytest.approx(20.0)


def test_a_tpot_slo_is_not_met_by_whole_body_replies_and_says_so(tmp_path: Path) -> None:
    runs = load_runs([_mixed_run(tmp_path / "r.rpr")])
    doc = build_document(runs, slos=parse_slo("tpot<=10ms"), slo_spec="tpot<=10ms")
    g = doc["runs"][0]["goodput"]
    assert g["good"] == 2 and g["not_applicable"] == 2  # the streaming pair misses, 2 not judged
    text = "\n".join(n for t in report_tables(doc) for n in t.notes)
    assert "2 non-streaming or one-token replies have no TPOT/ITL" in text


def _untimed_trace(path: Path, n: int = 20) -> Path:
    shapes = [RequestShape(offset_ns=i * 100_000_000, input_tokens=100, output_tokens=20) for i in range(n)]
    clock = count(1)
    write_trace(path, TraceHeader(start_wall_ns=1), shapes, mono_ns=lambda: next(clock), wall_ns=lambda: 1)
    return path


def test_a_baseline_without_timings_shows_dashes_not_zeros(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _untimed_trace(tmp_path / "synthetic.rpt")
    baseline = baseline_run(trace)
    run = write_run(
        tmp_path / "a.rpr",
        [result(i, completion_tokens=20, gaps_us=[1000] * 19) for i in range(20)],
        label="a",
        digest=baseline.trace_digest,
    )
    assert main(["report", str(run), "--baseline", str(trace), "--slo", "ttft<=500ms", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    base = doc["runs"][1]
    assert base["timed_requests"] == 0
    assert base["goodput"] is None and base["concurrency"]["mean"] is None
    assert all(c["ttft"]["p50_verdict"] == "not measured" for c in doc["comparisons"])
    assert main(["report", str(run), "--baseline", str(trace), "--slo", "ttft<=500ms"]) == 0
    text = capsys.readouterr().out
    assert "0.0% (0/20)" not in text
    assert re.search(rf"meeting all SLOs +100\.0% \(20/20\) +{MISSING}\n", text)
    assert "no request has timings" in text


def test_labels_are_kept_as_given(tmp_path: Path) -> None:
    paths = [
        write_run(tmp_path / f"{i}.rpr", [result(j) for j in range(5)], label="chat-auto") for i in range(2)
    ]
    assert [r.label for r in load_runs(paths)] == ["chat-auto", "chat-auto"]


def _run_with_gpu(path: Path, command: str, lines: list[str]) -> Path:
    header = RunHeader(label="gpu-run", target="http://a", start_wall_ns=1, trace_digest="d1")
    with ResultWriter(path, header) as writer:
        for i in range(4):
            writer.write(result(i, completion_tokens=10, gaps_us=[1000] * 9))
        writer.write_extra("gpu", {"command": command, "lines": [[i, line] for i, line in enumerate(lines)]})
    return path


def test_gpu_samples_reach_text_html_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with_header = _run_with_gpu(
        tmp_path / "a.rpr",
        "nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv -lms 250",
        [
            "index, memory.used [MiB], utilization.gpu [%]",
            "0, 1000 MiB, 20 %",
            "1, 3000 MiB, 60 %",
            "0, 5000 MiB, 40 %",
            "garbage",
        ],
    )
    assert main(["report", str(with_header), "--json"]) == 0
    g = json.loads(capsys.readouterr().out)["runs"][0]["gpu"]
    assert g["memory_used_peak_mib"] == 5000 and g["utilization_mean_pct"] == pytest.approx(40.0)
    assert g["gpus"] == 2 and g["samples"] == 3 and g["unparsed"] == 1
    html = tmp_path / "r.html"
    assert main(["report", str(with_header), "--html", str(html)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"GPU memory used, peak MiB +5000", text)
    assert "GPU memory used, peak MiB" in html.read_text(encoding="utf-8")


def test_gpu_samples_without_a_header_use_the_query_list() -> None:
    record = {
        "command": "nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits",
        "lines": [[0, "10, 700"], [1, "30, 900"]],
    }
    g = gpu.summarize(record)
    assert g["memory_used_peak_mib"] == 900 and g["utilization_mean_pct"] == pytest.approx(20.0)
    assert g["gpus"] is None
