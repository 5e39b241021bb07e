"""Verdicts on the simulated engine: an A/A comparison finds no difference, a prefix cache wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayproxy.cli import main
from tests.replay import traces
from tests.report.helpers import opening_of
from tests.servers import sim

pytestmark = pytest.mark.slow


def _replay(trace: Path, url: str, out: Path, label: str, *extra: str) -> None:
    argv = ["replay", str(trace), "--target", url, "-o", str(out), "--flavor", "vllm", "--quiet"]
    assert main([*argv, "--label", label, *extra]) == 0


def _verdict(paths: list[Path], slo: str, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:  # type: ignore[type-arg]
    capsys.readouterr()  # the replays' summaries
    assert main(["report", *map(str, paths), "--slo", slo, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["report", *map(str, paths), "--slo", slo]) == 0
    return doc["verdict"], "\n".join(opening_of(capsys.readouterr().out))


def test_the_same_config_under_two_labels_is_no_clear_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = traces.write_synthetic(
        tmp_path / "aa.rpt",
        requests=40,
        rate_rps=20.0,
        prefix_groups=2,
        prefix_len_tokens=256,
        input_len="uniform:300,600",
        output_len="uniform:8,24",
    )
    with sim("--speed", "2") as server:
        for label in ("A", "B"):
            _replay(trace, server.url, tmp_path / f"{label}.rpr", label, "--repeat", "3", "--warmup", "5")
    paths = sorted(tmp_path.glob("*-run*.rpr"))
    assert len(paths) == 6
    verdict, opening = _verdict(paths, "ttft<=200ms,tpot<=50ms", capsys)
    assert verdict["winner"] is None and verdict["noise"] == "measured", opening
    assert "no clear difference" in opening and "3 runs each" in opening


def test_a_prefix_cache_wins_on_a_prefix_heavy_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = traces.write_synthetic(
        tmp_path / "prefix.rpt",
        requests=60,
        rate_rps=12.0,
        prefix_groups=2,
        prefix_len_tokens=3000,
        input_len="uniform:3100,3300",
        output_len="uniform:8,16",
    )
    results = []
    for label, options in (("prefix-cache-on", ()), ("prefix-cache-off", ("--no-prefix-cache",))):
        with sim("--max-model-len", "8192", *options) as server:
            out = tmp_path / f"{label}.rpr"
            _replay(trace, server.url, out, label)
            results.append(out)
    verdict, opening = _verdict(results, "ttft<=500ms", capsys)
    assert verdict["winner"] == "prefix-cache-on" and verdict["versus"] == "prefix-cache-off", opening
    margin = verdict["margin"]
    if "goodput_over_none" in margin:  # on a loaded machine the uncached engine may meet it for no request
        assert margin["goodput_over_none"] > 0 and "prefix-cache-on wins with" in opening
    else:
        assert margin["estimate"] > 1.5 and margin["ci95_low"] > 1.0
        assert "prefix-cache-on sustains" in opening and "goodput at this SLO, 95% CI [" in opening
    assert "run-to-run noise unknown" in opening  # one run each


def _gate(paths: list[Path], base: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(
        ["report", *map(str, paths), "--slo", GATE_SLO, "--gate", "goodput>=0.95*BASE", "--gate-base", base]
    )
    return code, capsys.readouterr().err.strip()


GATE_SLO = "ttft<=300ms"


def test_the_gate_reads_run_to_run_noise_like_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a run-to-run noise of +-40 % between repetitions, an A/A pair of three runs each does not
    fail the gate (measured: runs 10-14.5 req/s each, B/A 0.99x, CI [0.75, 1.28]: inconclusive);
    turning the prefix cache off on a prefix-heavy trace does, with the interval in its one line."""
    trace = traces.write_synthetic(
        tmp_path / "prefix.rpt",
        requests=40,
        rate_rps=14.0,
        prefix_groups=2,
        prefix_len_tokens=3000,
        input_len="uniform:3100,3300",
        output_len="uniform:8,16",
    )
    noisy = ("--max-model-len", "8192", "--run-noise", "0.4", "--seed", "3")
    with sim(*noisy) as server:
        for label in ("A", "B"):
            _replay(trace, server.url, tmp_path / f"{label}.rpr", label, "--repeat", "3", "--warmup", "5")
    aa = sorted(tmp_path.glob("[AB]-run*.rpr"))
    assert len(aa) == 6
    code, err = _gate(aa, "A", capsys)
    assert code in (0, 3), err  # passed, or straddling: never a false regression
    if code == 3:
        assert err.startswith("replayproxy report: gate inconclusive, run more repetitions: B goodput>=")
    with sim(*noisy, "--no-prefix-cache") as server:
        _replay(trace, server.url, tmp_path / "off.rpr", "off", "--repeat", "3", "--warmup", "5")
    off = sorted(tmp_path.glob("off-run*.rpr"))
    code, err = _gate([*aa[:3], *off], "A", capsys)
    assert code == 1, err
    assert err.startswith("replayproxy report: gate failed: off goodput>=0.95*BASE: ")
    assert "95% CI [" in err and "] is below 0.95 (3 runs each)" in err and "\n" not in err
