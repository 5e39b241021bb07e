"""`replay --warmup --repeat` against the simulated engine: warm-up left out, a reset before each run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayproxy.cli import main
from replayproxy.results import load_results
from tests.replay import traces
from tests.servers import sim

pytestmark = pytest.mark.slow


def test_warmup_then_repetitions_each_after_a_cache_reset(tmp_path: Path) -> None:
    trace = traces.write_synthetic(
        tmp_path / "t.rpt",
        requests=30,
        rate_rps=20.0,
        prefix_groups=2,
        prefix_len_tokens=256,
        input_len="uniform:300,400",
        output_len="uniform:4,12",
    )
    out = tmp_path / "run.rpr"
    with sim("--speed", "4", "--kv-cache-dtype", "fp8") as server:
        code = main(
            ["replay", str(trace), "--target", server.url, "-o", str(out), "--flavor", "vllm", "--quiet",
             "--label", "cand", "--warmup", "5", "--repeat", "2", "--engine-args", "--kv-cache-dtype fp8",
             "--note", "canary"]
        )  # fmt: skip
    assert code == 0 and not out.exists()
    runs = load_results([tmp_path / "run-run1.rpr", tmp_path / "run-run2.rpr"])
    assert [(r.header.label, r.header.repetition, r.header.repetitions) for r in runs] == [
        ("cand", 1, 2),
        ("cand", 2, 2),
    ]
    for run in runs:
        assert len(run) == 30  # the warm-up requests are not among the results
        assert run.header.warmup == {"spec": "5", "requests": 5, "errors": 0, "duration_s": pytest.approx(
            run.header.warmup["duration_s"])}  # fmt: skip
        assert run.header.pre_run["reset_prefix_cache"] == "ok"
        contract = run.header.contract
        assert contract["max_model_len"] > 0 and contract["engine_args"] == "--kv-cache-dtype fp8"
        assert contract["engine_config"]["cache_dtype"] == "fp8" and contract["note"] == "canary"
        # The reset emptied the cache the warm-up and the previous run had filled.
        first = int(list(run.column("index")).index(0))
        assert run.column("cached_tokens")[first] == 0


def test_bad_warmup_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = str(tmp_path / "o.rpr")
    assert main(["replay", "t.rpt", "--target", "http://x", "-o", out, "--warmup", "ten"]) == 2
    assert "--warmup must be a request count or seconds" in capsys.readouterr().err


def test_a_closed_loop_sweep_against_the_sim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = traces.write_synthetic(
        tmp_path / "c.rpt", requests=24, rate_rps=4.0, input_len="uniform:50,100", output_len="uniform:8,16"
    )
    with sim("--speed", "4") as server:
        out = str(tmp_path / "sw")
        argv = ["sweep", str(trace), "--target", server.url, "--concurrency", "1,4", "-o", out, "--json",
                "--replay-args", "--flavor", "vllm", "--no-calibrate"]  # fmt: skip
        assert main(argv) == 0
    (sweep,) = json.loads(capsys.readouterr().out)["sweeps"]
    assert sweep["closed_loop"] and [s["concurrency_limit"] for s in sweep["steps"]] == [1, 4]
    one, four = sweep["steps"]
    # With every request due at once, four in flight finish the trace faster than one.
    assert four["requests_per_s"] > 1.5 * one["requests_per_s"]
    assert one["requests"] == four["requests"] == 24 and not one["errors"]
