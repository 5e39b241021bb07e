"""`replayproxy compare` against two simulated engines: warm-up, resets, interleaved runs, the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from replayproxy.cli import main
from replayproxy.replay.procedure import interleaved
from replayproxy.report.runs import load_runs
from tests.replay import traces
from tests.report.helpers import opening_of
from tests.servers import sim

pytestmark = pytest.mark.slow


def test_compare_interleaves_the_repetitions_of_two_engines_and_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = traces.write_synthetic(
        tmp_path / "t.rpt",
        requests=30,
        rate_rps=20.0,
        prefix_groups=2,
        prefix_len_tokens=512,
        input_len="uniform:600,900",
        output_len="uniform:8,16",
    )
    out = tmp_path / "runs"
    with sim("--speed", "2", "--run-noise", "0.2") as a, sim("--speed", "2", "--no-prefix-cache") as b:
        argv = ["compare", str(trace), "--target", f"on={a.url}", "--target", f"off={b.url}", "-o", str(out)]
        code = main(
            [
                *argv,
                "--repeat",
                "3",
                "--warmup",
                "5",
                "--slo",
                "ttft<=2s",
                "--replay-args",
                "--flavor",
                "vllm",
            ]
        )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    names = sorted(p.name for p in out.glob("*.rpr"))
    assert names == [f"{label}-run{i}.rpr" for label in ("off", "on") for i in (1, 2, 3)]
    runs = load_runs([str(out)])
    started = sorted((r.headers[0].start_wall_ns, r.label, r.repetition) for r in runs)
    assert [(label, i) for _, label, i in started] == [(x, i) for i in (1, 2, 3) for x in ("on", "off")]
    for run in runs:  # each measured run came after the flavor's cache reset, and after the warm-up
        assert run.headers[0].pre_run["reset_prefix_cache"] == "ok"
        assert run.headers[0].warmup["requests"] == 5
    progress = [line for line in captured.err.splitlines() if line.startswith("replayproxy compare: run ")]
    assert progress[:2] == [
        "replayproxy compare: run 1/6: on, repetition 1",
        "replayproxy compare: run 2/6: off, repetition 1",
    ]
    opening = "\n".join(opening_of(captured.out))
    assert opening.startswith("Verdict") and "3 runs each" in opening
    assert "one candidate after the other" not in opening


def test_a_seed_shuffles_each_round() -> None:
    plain = interleaved(["A", "B", "C"], 4)
    assert plain == [(x, i) for i in (1, 2, 3, 4) for x in "ABC"]
    shuffled = interleaved(["A", "B", "C"], 4, seed=7)
    assert shuffled != plain and shuffled == interleaved(["A", "B", "C"], 4, seed=7)
    for i in (1, 2, 3, 4):  # every round still holds one run of each candidate
        assert sorted(x for x, r in shuffled if r == i) == ["A", "B", "C"]


def test_bad_compare_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["compare", str(tmp_path / "t.rpt"), "-o", str(tmp_path / "o")]
    assert main([*base, "--target", "A=http://127.0.0.1:1"]) == 2
    assert "compare needs two or more --target LABEL=URL" in capsys.readouterr().err
    two = ["--target", "A=http://127.0.0.1:1", "--target", "B=http://127.0.0.1:2"]
    assert main([*base, *two, "--replay-args", "--repeat", "2"]) == 2
    assert "--replay-args must not set --repeat" in capsys.readouterr().err
