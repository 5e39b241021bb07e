"""The text report as a person reads it: it fits the terminal, and every count agrees with its notes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from replayproxy.report.cells import Table
from replayproxy.report.document import build_document
from replayproxy.report.goodput import parse_slo
from replayproxy.report.render_text import WIDTH, format_text, render_text
from replayproxy.report.runs import load_runs
from replayproxy.report.sections import report_tables
from tests.report.helpers import result, write_run

SLO = "ttft<=300ms,tpot<=60ms"
N = 200


def _candidate(path: Path, label: str, seed: int, *, failing: float = 0.0) -> Path:
    """N requests of a demo-like candidate: lognormal latencies, some failing, two endpoints."""
    rng = np.random.default_rng(seed)
    ttft = rng.lognormal(4.5, 0.8, N)
    rows = []
    for i in range(N):
        error = "http_5xx" if rng.random() < failing else ""
        tokens = int(rng.integers(2, 80))
        gap = int(rng.lognormal(9.5, 0.4))
        e2e = float(ttft[i]) + tokens * gap / 1000
        rows.append(
            result(i, ttft_ms=float(ttft[i]), e2e_ms=e2e, sent_ms=75.0 * i, gaps_us=[gap] * (tokens - 1),
                   completion_tokens=tokens, prompt_tokens=int(rng.integers(50, 6000)),
                   endpoint="chat" if i % 3 else "completions", error=error)
        )  # fmt: skip
    return write_run(path, rows, label=label, options={"speed": 1.0})


def _document(tmp_path: Path, labels: list[str], *, failing: dict[str, float] | None = None) -> dict:  # type: ignore[type-arg]
    paths = [
        _candidate(tmp_path / f"{i}.rpr", label, i, failing=(failing or {}).get(label, 0.0))
        for i, label in enumerate(labels)
    ]
    runs = load_runs(paths)
    return build_document(runs, slos=parse_slo(SLO), slo_spec=SLO, resamples=200)  # type: ignore[return-value]


def test_a_demo_like_report_fits_100_columns(tmp_path: Path) -> None:
    doc = _document(tmp_path, ["prefix-cache-on", "prefix-cache-off"], failing={"prefix-cache-off": 0.05})
    text = render_text(doc)  # type: ignore[arg-type]
    assert text.startswith("Verdict\n-------\n")
    assert "Paired: prefix-cache-off vs prefix-cache-on" in text
    wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert wide == []
    # The verdict's sentence is wrapped, not cut: its words all come back when the lines are joined.
    verdict = text.split("\n\n", 1)[0]
    assert "    " in verdict and "provisional: run-to-run noise unknown" in " ".join(verdict.split())


def test_many_candidates_split_a_table_into_blocks_that_fit(tmp_path: Path) -> None:
    labels = [f"vllm-0.{i}-tensor-parallel-{i}-long-name" for i in range(5)]
    doc = _document(tmp_path, labels)
    text = render_text(doc)  # type: ignore[arg-type]
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    latency = next(block for block in text.split("\n\nThroughput")[0].split("Latency\n-------\n")[1:])
    # Every candidate's column is still there, each block repeating the row names (metric, stat).
    for label in labels:
        assert label in latency
    assert latency.count("TTFT ms") >= 2
    # A wider terminal gets wider lines and fewer blocks.
    wide = render_text(doc, 220)  # type: ignore[arg-type]
    assert max(len(line) for line in wide.splitlines()) > WIDTH
    assert len(wide.splitlines()) < len(text.splitlines())


def test_a_cell_wider_than_the_page_is_cut_with_an_ellipsis() -> None:
    table = Table("Contract", ["", "a"], [["--engine-args", "x" * 300]], ["note " * 60])
    lines = format_text([table], 60).splitlines()
    assert max(len(line) for line in lines) <= 60
    assert lines[3].startswith("--engine-args") and lines[3].endswith("x\u2026")


def _cells(table: Table, row: str) -> list[str]:
    return next(r for r in table.rows if r[0] == row)[1:]


def _count(cell: str) -> int:
    """The count in a cell like '1.5% (3)' or '94.0% (141/150)' (the last number in brackets)."""
    found = re.findall(r"\((\d+)(?:/(\d+))?\)", cell)
    assert found, cell
    good, of = found[-1]
    return int(of or good)


@pytest.mark.parametrize("failing", [0.0, 0.1, 1.0])
def test_every_table_agrees_with_its_notes_and_the_other_tables(tmp_path: Path, failing: float) -> None:
    """One document, its counts read back from the rendered tables: they agree everywhere, also when
    every request of a candidate failed (a paired table of 0 pairs over 200 common requests must say so)."""
    doc = _document(tmp_path, ["A", "B"], failing={"B": failing})
    tables = {t.title: t for t in report_tables(doc)}  # type: ignore[arg-type]
    throughput, errors, good = tables["Throughput and load"], tables["Errors"], tables[f"Goodput ({SLO})"]
    requests = [int(c) for c in _cells(throughput, "requests")]
    succeeded = [int(c) for c in _cells(throughput, "succeeded")]
    failed = [_count(c) for c in _cells(errors, "error rate")]
    assert requests == [N, N] and [r - s for r, s in zip(requests, succeeded, strict=True)] == failed
    by_class = [sum(int(r[i]) for r in errors.rows[1:]) for i in (1, 2)]
    assert by_class == failed
    meeting = _cells(good, "meeting all SLOs")
    assert [_count(c) for c, s in zip(meeting, succeeded, strict=True) if s] == [
        r for r, s in zip(requests, succeeded, strict=True) if s
    ]
    latency = tables["Latency"]
    counts = [r[2:] for r in latency.rows if r[1] == "count"]
    assert all(int(c) <= s for row in counts[:2] for c, s in zip(row, succeeded, strict=True))  # TTFT, TPOT
    for title in ("By endpoint", "By input length (tokens)"):
        for k, run in enumerate(("A", "B")):
            rows = [r for r in tables[title].rows if r[1] == run]
            assert sum(int(r[2]) for r in rows) == requests[k] and sum(int(r[3]) for r in rows) == failed[k]
    verdict = " ".join(tables["Verdict"].notes)
    for k, run in enumerate(("A", "B")):
        said = re.search(rf"{run}: goodput (\S+) req/s", verdict).group(1)  # type: ignore[union-attr]
        shown = _cells(good, "goodput req/s")[k]
        assert said == shown == "\u2013" or float(said) == pytest.approx(float(shown), rel=5e-3)
    paired = tables["Paired: B vs A"]
    common = int(re.search(r"of the (\d+) requests in both first runs", " ".join(paired.notes)).group(1))  # type: ignore[union-attr]
    assert common == N
    pairs = {r[0]: int(r[1]) for r in paired.rows if r[0]}
    assert pairs == {"TTFT": succeeded[1], "E2E": succeeded[1]}  # A never failed: B's successes pair
    notes = " ".join(paired.notes)
    if not succeeded[1]:
        assert f"no pair: none of the {N} requests in both first runs was measured by both" in notes
