"""Figures agents are judged by: session makespan under an SLO, latency by depth, cached share per call."""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import count
from pathlib import Path

import pytest

from replayproxy.cli import main
from replayproxy.report.document import run_doc
from replayproxy.report.goodput import goodput, parse_slo
from replayproxy.report.runs import load_runs
from replayproxy.results import ReplayResult
from replayproxy.shape import RequestShape
from replayproxy.trace import TraceHeader, write_trace
from tests.report.helpers import opening_of, result, write_run

MS = 1_000_000


def request(
    index: int, session: int, turn: int, sent_ms: float, e2e_ms: float, error: str = ""
) -> ReplayResult:
    call = result(index, sent_ms=sent_ms, e2e_ms=e2e_ms, ttft_ms=e2e_ms / 4, error=error)
    return replace(call, session=session, turn=turn)


def agent_run(path: Path, stretch: float, *, label: str) -> Path:
    """Three sessions: a root, two parallel branches, a join (session 1); a line of two (session 2);
    one whose second call fails (session 3). `stretch` scales every call's E2E and the sends after."""
    s = stretch
    rows = [
        request(0, 1, 0, 0, 100 * s),
        request(1, 1, 1, 100 * s, 200 * s),
        request(2, 1, 1, 100 * s, 300 * s),
        request(3, 1, 2, 400 * s, 100 * s),  # session 1: 0 .. 500 s ms
        request(4, 2, 0, 50, 200 * s),
        request(5, 2, 1, 50 + 200 * s, 250 * s),  # session 2: 50 .. 50 + 450 s ms
        request(6, 3, 0, 100, 100 * s),
        request(7, 3, 1, 100 + 100 * s, 10, error="http_5xx"),
    ]
    return write_run(path, rows, label=label)


def test_makespan_clause_counts_sessions_meeting_it(tmp_path: Path) -> None:
    (run,) = load_runs([agent_run(tmp_path / "a.rpr", 1.0, label="a")])
    g = goodput(run.measures, parse_slo("makespan<=480ms"))
    # session 1 takes 500 ms (missed), session 2 450 ms (met), session 3 has a failed call (missed)
    assert g.sessions is not None and (g.sessions.good, g.sessions.total) == (1, 3)
    assert g.sessions.sessions_per_s == pytest.approx(1 / 0.5)  # the run spans 0 .. 500 ms
    assert g.good == 7  # per request only success counts: the makespan clause judges sessions
    # a per-request clause beside it makes a session good only when all its requests are
    g = goodput(run.measures, parse_slo("makespan<=1s,e2e<=240ms"))
    assert g.sessions is not None and g.sessions.good == 0  # session 1's 300 ms, session 2's 250 ms
    g = goodput(run.measures, parse_slo("makespan:p50<=460ms"))
    assert g.sessions is not None and g.sessions.good == 2  # no per-session limit: request goodness only
    (check,) = g.checks
    assert check.value_ms == pytest.approx(450) and check.count == 3 and check.met


def test_makespan_parses_and_unknown_metric_lists_it() -> None:
    (slo,) = parse_slo("makespan<=60s")
    assert slo.per_session and slo.limit_ms == 60_000 and slo.percentile is None
    with pytest.raises(ValueError, match="makespan"):
        parse_slo("walltime<=60s")


def test_verdict_decides_by_makespan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fast = agent_run(tmp_path / "fast.rpr", 1.0, label="fast")
    slow = agent_run(tmp_path / "slow.rpr", 1.5, label="slow")
    # per request both meet a loose E2E limit on every successful call: 8 calls cannot separate them
    assert main(["report", str(fast), str(slow), "--slo", "e2e<=1s"]) == 0
    assert "no clear difference" in "\n".join(opening_of(capsys.readouterr().out))
    assert main(["report", str(fast), str(slow), "--slo", "makespan<=600ms", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    verdict = doc["verdict"]
    assert verdict["winner"] == "fast" and verdict["versus"] == "slow"
    assert any("sessions/s" in line and "no session" in line for line in verdict["lines"]), verdict["lines"]
    fast_doc = next(c for c in verdict["candidates"] if c["label"] == "fast")
    assert fast_doc["sessions"] == 3 and fast_doc["goodput_fraction"] == pytest.approx(2 / 3)
    assert "goodput_sessions_per_s" in fast_doc and "goodput_requests_per_s" not in fast_doc
    sessions = doc["runs"][0]["goodput"]["sessions"]
    assert (sessions["good"], sessions["of"]) == (2, 3)
    assert main(["report", str(fast), str(slow), "--slo", "makespan<=600ms"]) == 0
    text = capsys.readouterr().out
    assert "goodput sessions/s" in text and "sessions meeting all SLOs" in text


def test_makespan_and_latency_by_depth_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fast = agent_run(tmp_path / "fast.rpr", 1.0, label="fast")
    slow = agent_run(tmp_path / "slow.rpr", 2.0, label="slow")
    assert main(["report", str(fast), str(slow), "--json"]) == 0
    runs = {r["label"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert runs["fast"]["sessions"]["session_s"]["max"] == pytest.approx(0.5)
    assert runs["slow"]["sessions"]["session_s"]["max"] == pytest.approx(1.0)
    depth = {row["depth"]: row for row in runs["fast"]["sessions"]["by_depth"]}
    assert {k: v["requests"] for k, v in depth.items()} == {"0": 3, "1": 4, "2-3": 1}
    assert depth["1"]["e2e_ms"]["count"] == 3  # the failed call has no E2E
    assert depth["1"]["e2e_ms"]["p50"] == pytest.approx(250) and depth["2-3"]["e2e_ms"]["p95"] == 100
    assert depth["0"]["ttft_ms"]["p50"] == pytest.approx(25)
    assert main(["report", str(fast), str(slow)]) == 0
    text = capsys.readouterr().out
    assert "Latency by depth" in text and "depth 2-3: E2E ms p50 / p95" in text
    assert "makespan s (first send to last end) max" in text


def test_deep_graphs_fall_in_power_of_two_buckets(tmp_path: Path) -> None:
    rows = [request(i, 9, turn, 10 * i, 5) for i, turn in enumerate((0, 3, 4, 7, 8, 40, 64, 300))]
    (run,) = load_runs([write_run(tmp_path / "deep.rpr", rows)])
    sessions = run_doc(run, ())["sessions"]
    assert sessions is not None
    by_depth = sessions["by_depth"]
    assert by_depth is not None
    assert [(r["depth"], r["requests"]) for r in by_depth] == [
        ("0", 1),
        ("2-3", 1),
        ("4-7", 2),
        ("8-15", 1),
        ("32-63", 1),
        ("64+", 2),
    ]


def write_recorded(path: Path, cached: list[int]) -> Path:
    """The trace the runs replay: 4 calls of 1,000 prompt tokens with `cached` tokens as recorded."""
    shapes = [
        RequestShape(offset_ns=i * 100 * MS, input_tokens=1000, cached_tokens=c, ttft_ns=MS, e2e_ns=2 * MS)
        for i, c in enumerate(cached)
    ]
    clock = count(1)
    write_trace(path, TraceHeader(start_wall_ns=1), shapes, mono_ns=lambda: next(clock), wall_ns=lambda: 1)
    return path


def test_cached_share_per_call_beside_the_recorded_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_recorded(tmp_path / "t.rpt", [0, 900, 900, -1])
    rows = [replace(result(i, prompt_tokens=1000), cached_tokens=c) for i, c in enumerate([0, 500, 800, 700])]
    run = write_run(tmp_path / "a.rpr", rows, label="a")
    assert main(["report", str(run), "--baseline", str(trace), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    share = runs[0]["cached_share"]
    assert share["per_call"]["count"] == 4 and share["per_call"]["mean"] == pytest.approx(0.5)
    # the fourth call has no recorded cached count: pairs are the first three
    assert share["recorded"]["count"] == 3 and share["recorded"]["mean"] == pytest.approx(0.6)
    assert share["difference"]["mean"] == pytest.approx((0 - 0.4 - 0.1) / 3)
    assert share["difference"]["p50"] == pytest.approx(-0.1)
    assert runs[1]["cached_share"]["recorded"] is None  # the baseline is not paired with itself
    assert main(["report", str(run), "--baseline", str(trace)]) == 0
    text = capsys.readouterr().out
    assert "Cached tokens per call" in text and "share - recorded, per call mean" in text
