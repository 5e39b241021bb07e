"""`replayproxy report` through the real CLI: text, Markdown, JSON, errors, and no matplotlib needed."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from replayproxy.cli import main
from tests.report.check_helpers import both, write_check
from tests.report.helpers import result, synthetic_run, write_run
from tests.report.test_baseline import write_baseline_trace


@pytest.fixture
def two_runs(tmp_path: Path) -> list[str]:
    rng = np.random.default_rng(2)
    ttft = rng.lognormal(3.5, 0.4, 300)
    e2e = ttft + rng.lognormal(6, 0.3, 300)
    a = synthetic_run(tmp_path / "a.rpr", ttft, e2e, label="engine-a")
    b = synthetic_run(tmp_path / "b.rpr", ttft * 0.5, e2e * 0.8, label="engine-b")
    return [str(a), str(b)]


def test_json_has_documented_keys_and_numpy_figures(
    two_runs: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", *two_runs, "--json", "--slo", "ttft<=40ms,e2e:p99<=2s"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "replayproxy-report/1"
    a = doc["runs"][0]
    assert a["label"] == "engine-a" and a["requests"] == 300
    rng = np.random.default_rng(2)
    ttft = rng.lognormal(3.5, 0.4, 300)
    # stored as integer ns, so compare at ns precision
    assert a["ttft_ms"]["p99"] == pytest.approx(np.percentile(np.floor(ttft * 1e6) / 1e6, 99), abs=1e-6)
    assert a["ttft_ms"]["count"] == 300 and a["itl_unit"] == "chunk"
    for key in (
        "tpot_ms",
        "itl_ms",
        "e2e_ms",
        "schedule_lag_ms",
        "ttft_from_scheduled_ms",
        "e2e_from_scheduled_ms",
    ):
        assert set(a[key]) == {"p50", "p90", "p95", "p99", "max", "mean", "count"}
    assert set(a["concurrency"]) == {"mean", "peak"} and a["errors"]["count"] == 0
    assert a["goodput"]["of"] == 300 and a["goodput"]["percentile_checks"][0]["slo"] == "e2e:p99<=2000ms"
    windows = a["breakdowns"]["window_10s"]  # 300 requests 50 ms apart: 0-10 s and 10-15 s
    assert [(w["name"], w["requests"], w["arrival_rate_per_s"]) for w in windows] == [
        ("0s", 200, 20.0),
        ("10s", 100, 10.0),
    ]
    (cmp,) = doc["comparisons"]
    assert (cmp["a"], cmp["b"]) == ("engine-a", "engine-b")
    assert cmp["ttft"]["p50_verdict"] == "B is faster" and cmp["ttft"]["p50_diff_ms"]["ci95_high"] < 0
    assert cmp["ttft"]["median_ratio_b_over_a"] == pytest.approx(0.5, rel=0.01)


def test_text_is_side_by_side_and_markdown_is_tables(
    two_runs: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", *two_runs]) == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("metric"))
    assert header.split() == ["metric", "stat", "engine-a", "engine-b"]
    latency = next(block for block in text.split("\n\n") if block.startswith("Latency\n"))
    rows = [line.split() for line in latency.splitlines()]
    for stat in ("p50", "p90", "p95", "p99", "max", "mean", "count"):  # one row per latency figure
        assert sum(1 for r in rows if len(r) >= 3 and r[-3] == stat) == 7
    assert "Paired: engine-b vs engine-a" in text and "B is faster" in text
    assert main(["report", *two_runs, "--markdown"]) == 0
    md = capsys.readouterr().out
    assert (
        "### Latency" in md
        and "| metric | stat | engine-a | engine-b |" in md
        and "|---|---:|---:|---:|" in md
    )


def test_baseline_column_and_errors_by_class(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_baseline_trace(tmp_path / "t.rpt")
    digest = hashlib.sha256(trace.read_bytes()).hexdigest()
    run = write_run(
        tmp_path / "r.rpr",
        [result(0), result(1, error="timeout"), result(2, error="http_5xx")],
        label="cand",
        digest=digest,
    )
    other = write_run(tmp_path / "s.rpr", [result(0)], label="other trace", digest="elsewhere")
    assert main(["report", str(run), str(other), "--baseline", str(trace), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in doc["runs"]] == ["cand", "other trace", "baseline (production)"]
    assert doc["runs"][0]["errors"]["by_class"] == {"http_5xx": 1, "timeout": 1}
    assert doc["runs"][0]["errors"]["rate"] == pytest.approx(2 / 3)
    assert doc["runs"][0]["ttft_ms"]["count"] == 1  # says how many requests the statistic covers
    # only runs of the same trace pair: "other trace" replayed something else
    assert [(c["a"], c["b"]) for c in doc["comparisons"]] == [("baseline (production)", "cand")]


def test_text_and_json_work_without_matplotlib(
    two_runs: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # any import of it now fails
    assert main(["report", *two_runs]) == 0
    assert main(["report", *two_runs, "--json"]) == 0
    capsys.readouterr()
    assert main(["report", *two_runs, "--html", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "replayproxy report: error: --html needs matplotlib: pip install 'replayproxy[report]'"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slo", "ttft<500ms"], "needs '<='"),
        (["--resamples", "5"], "--resamples must be at least 100"),
        (["--max-error-rate", "2"], "--max-error-rate must be in (0, 1]"),
    ],
)
def test_bad_input_is_one_line(
    two_runs: list[str], argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", *two_runs, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_missing_and_foreign_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope.rpr")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "junk.rpr").write_bytes(b"hello")
    assert main(["report", str(tmp_path / "junk.rpr")]) == 2
    assert "not a replayproxy file" in capsys.readouterr().err


def test_every_json_key_is_documented(two_runs: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", *two_runs, "--json", "--slo", "ttft<=40ms,e2e:p99<=2s"]) == 0
    doc = json.loads(capsys.readouterr().out)
    schema = (Path(__file__).parents[2] / "docs" / "report.md").read_text(encoding="utf-8")
    keys = set(doc) | set(doc["runs"][0]) | set(doc["runs"][0]["goodput"]) | set(doc["comparisons"][0])
    keys |= set(doc["comparisons"][0]["ttft"]) | set(doc["runs"][0]["breakdowns"]["window_10s"][0])
    undocumented = sorted(k for k in keys if k not in schema)
    assert not undocumented


def test_check_results_beside_replay_results(
    two_runs: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check = write_check(tmp_path / "c.rpc", both(output_hash="z", similarity_ppm=0))
    assert main(["report", *two_runs, str(check)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Output check verdict") and "engine-b" in text
    assert main(["report", *two_runs, str(check), "--json", "--gate", "match>=0.5"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "replayproxy-report/1"
    assert doc["checks"][0]["gate"]["failures"] == ["match>=0.5: B 0"]
    assert main(["report", *two_runs, "--gate", "match>=0.5"]) == 2
    assert "--gate rules without *BASE read output-check results (.rpc)" in capsys.readouterr().err
    assert main(["report", str(check), "--gate", "goodput>=0.9*BASE"]) == 2
    assert "--gate rules with *BASE read replay results (.rpr); none given" in capsys.readouterr().err


def test_check_results_alone_refuse_replay_only_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check = write_check(tmp_path / "c.rpc", both())
    assert main(["report", str(check), "--html", str(tmp_path / "r.html")]) == 2
    assert "--html and --baseline need replay results (.rpr)" in capsys.readouterr().err
    assert main(["report", str(check), "--markdown"]) == 0
    assert capsys.readouterr().out.startswith("### Output check verdict")


def test_a_truncated_result_is_reported_with_what_was_read_and_exit_2(
    two_runs: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = Path(two_runs[1]).read_bytes()
    Path(two_runs[1]).write_bytes(data[: len(data) // 2])  # a crash, a full disk, a cut copy
    assert main(["report", *two_runs, "--json"]) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # the report of what was read comes all the same
    assert [r["label"] for r in doc["runs"]] == ["engine-a", "engine-b"]
    read = doc["runs"][1]["requests"]
    assert 0 <= read < 300 and doc["runs"][0]["requests"] == 300
    assert any(w.startswith(f"{two_runs[1]}: read in part (") for w in doc["warnings"])
    assert "warning: result files read in part (truncated or damaged): engine-b" in doc["verdict"]["lines"]
    (line,) = captured.err.splitlines()
    assert line.startswith(f"replayproxy report: {two_runs[1]}: read in part (truncated")
    said = f"{read} requests read; the report covers what was read (--allow-partial accepts it)"
    assert line.endswith(said)
    assert main(["report", *two_runs, "--allow-partial"]) == 0
    assert capsys.readouterr().err == ""


def test_a_copied_result_file_counts_once_with_a_warning(
    two_runs: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "c.rpr"
    copy.write_bytes(Path(two_runs[0]).read_bytes())
    assert main(["report", *two_runs, str(copy), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in doc["runs"]] == ["engine-a", "engine-b"]  # not "engine-a (run 1/2)"
    assert f"{copy} is a copy of {two_runs[0]} (the same run): counted once" in doc["warnings"]
