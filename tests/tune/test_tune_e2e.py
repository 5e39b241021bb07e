"""`replayproxy tune` on real sims: the grid's best found and confirmed, engines stopped, resumable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from replayproxy.report.goodput import parse_slo
from replayproxy.report.runs import load_runs
from replayproxy.report.sweep import meets, step_of
from replayproxy.tune.candidates import parse_candidates
from replayproxy.tune.engine import running
from tests.processes import survivors

SLO = "ttft:p95<=250ms"
SIM = f"{sys.executable} -m replayproxy.sim --port {{port}}"
KNOBS = "--max-num-seqs {max_num_seqs} --max-num-batched-tokens {max_num_batched_tokens}"
# Best first, so the early stop is exercised: every later configuration is tried at the best speed first.
CANDIDATES = f"""
[[engine]]
name = "sim"
command = "{SIM} {KNOBS}"
grid = {{ max_num_seqs = [16, 4, 1], max_num_batched_tokens = [4096, 64] }}
replay_args = ["--model", "sim-llama-3.1-8b"]
start_timeout = 60
stop_timeout = 10

[[engine]]
name = "small"
command = "{SIM} --max-num-seqs {{max_num_seqs}}"
grid = {{ max_num_seqs = [4] }}
replay_args = ["--model", "sim-llama-3.1-8b"]

[[engine]]
name = "broken"
command = "{SIM} --no-such-flag {{x}}"
grid = {{ x = [1] }}
"""
TUNE = ["--slo", SLO, "--repeat", "1", "--precision", "0.3", "--max-runs", "5", "--warmup", "5"]


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replayproxy", *argv], capture_output=True, text=True, timeout=500, check=False
    )


def _group_gone(pid: int) -> bool:
    return survivors([], groups=[pid]) == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tune_finds_the_best_configuration_stops_every_engine_and_resumes(tmp_path: Path) -> None:
    trace, candidates, out = tmp_path / "w.rpt", tmp_path / "candidates.toml", tmp_path / "tune"
    synth = ["synth", "-o", str(trace), "--requests", "24", "--rate", "20", "--input-len", "fixed:400"]
    assert _cli(*synth, "--output-len", "fixed:16", "--seed", "1").returncode == 0
    candidates.write_text(CANDIDATES)

    done = _cli("tune", str(trace), "--candidates", str(candidates), "-o", str(out), *TUNE)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "tune.json").read_text())
    outcomes = {(o["engine"], o["config"]): o for o in summary["outcomes"]}
    assert len(outcomes) == 8

    # Every engine it started is gone, and each start was a separate process.
    pids = [o["pid"] for o in outcomes.values() if o["pid"] is not None]
    assert len(pids) == 7 and len(set(pids)) == 7
    assert all(_group_gone(pid) for pid in pids)

    # The broken configuration is recorded with its log and did not stop the search.
    broken = outcomes[("broken", "x=1")]
    assert broken["status"] == "failed" and "exited with status 2" in broken["reason"]
    assert "unrecognized arguments: --no-such-flag" in broken["log_tail"]
    assert "broken[x=1]: exited with status 2" in done.stdout

    winner_key = summary["best"]["sim"]
    winner = outcomes[("sim", winner_key)]
    assert winner_key == "max_num_seqs=16,max_num_batched_tokens=4096"
    best_speed = winner["best_speed"]
    # Each run's contract records the full command line and the knob values.
    (header,) = load_runs([winner["probes"][0]["path"]])[0].headers
    assert header.contract["engine_args"] == winner["command"] and "--max-num-seqs 16" in winner["command"]
    assert header.contract["note"] == f"tune sim: {winner_key}"
    # The early stop: later configurations started at the best speed and, failing there beyond the
    # noise, cost one run. On a busy machine a replay can be client-bound instead: such a step is
    # marked and searched past, never counted as the engine's failure (so never an early stop).
    sims = [o for o in outcomes.values() if o["engine"] == "sim"]
    early = [o for o in sims if o["stopped"].startswith("cannot beat the best so far: fails at")]
    assert all(len(o["probes"]) == 1 for o in early)
    assert early or any("client-bound" in o["stopped"] for o in sims), [o["stopped"] for o in sims]

    # Brute force: every configuration replayed a little below the winner's answer; only the winner holds it.
    (engine,) = parse_candidates({"engine": [_sim_engine()]}, "c")
    slos, speed = parse_slo(SLO), 0.8 * best_speed
    held = {}
    for config in engine.configurations():
        with running(config, tmp_path / "brute" / config.directory_name / "engine.log") as sim:
            path = tmp_path / "brute" / f"{config.directory_name}.rpr"
            replay = [
                "replay",
                str(trace),
                "--target",
                sim.url,
                "--speed",
                f"{speed:g}",
                "-o",
                str(path),
            ]
            assert _cli(*replay, "--quiet", "--model", "sim-llama-3.1-8b").returncode == 0
            held[config.key] = meets(step_of(load_runs([path])[0], slos), 0.01, 0.9)
    assert held == {key: key == winner_key for key in held}

    # Best vs best: the two engines compared at one common rate, through the report.
    assert set(summary["best"]) == {"sim", "small"}
    assert "verdict: sim sustains" in done.stdout
    assert "max offered req/s under SLO  achieved req/s" in done.stdout
    assert "summary: the best sim configuration is max_num_seqs=" in done.stdout  # one per engine
    assert "summary: the best small configuration is " in done.stdout
    assert len(summary["final"]) == 2 and "sim[max_num_seqs=16" in done.stdout.split("verdict")[-1]

    # A rerun with the same directory measures nothing again and starts no engine.
    again = _cli("tune", str(trace), "--candidates", str(candidates), "-o", str(out), *TUNE, "--no-final")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("not measured again") == 8
    assert "healthy after" not in again.stderr
    assert json.loads((out / "tune.json").read_text())["best"] == summary["best"]


def _sim_engine() -> dict[str, object]:
    return {
        "name": "sim",
        "command": f"{SIM} {KNOBS}",
        "grid": {"max_num_seqs": [16, 4, 1], "max_num_batched_tokens": [4096, 64]},
        "stop_timeout": 10,
    }


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_restart_between_runs_gives_each_run_a_cold_cache_where_the_engine_has_no_reset(
    tmp_path: Path, bpe_tokenizer: Path
) -> None:
    """A sim speaking llama.cpp without --slot-save-path: the slot erase answers 501, so every run
    is cache-warm; restarting the engine before each run is then the only cold start."""
    trace, candidates, out = tmp_path / "w.rpt", tmp_path / "candidates.toml", tmp_path / "tune"
    synth = ["synth", "-o", str(trace), "--requests", "16", "--rate", "20", "--input-len", "fixed:300"]
    synth += ["--prefix-groups", "1", "--prefix-len", "200", "--output-len", "fixed:4", "--seed", "2"]
    assert _cli(*synth).returncode == 0
    llama = f"{SIM} --dialect llamacpp --tokenizer {bpe_tokenizer} --speed {{speed}}"
    replay_args = f'["--flavor", "llamacpp", "--tokenizer", "{bpe_tokenizer}", "--model", "sim-llama-3.1-8b"]'
    engines = [
        f'[[engine]]\nname = "{name}"\ncommand = "{llama}"\ngrid = {{ speed = [50] }}\n'
        f"replay_args = {replay_args}\nrestart_between_runs = {flag}\n"
        for name, flag in (("warm", "false"), ("cold", "true"))
    ]
    candidates.write_text("\n".join(engines))
    tune = ["--slo", "ttft:p95<=10s", "--repeat", "2", "--max-runs", "3", "--warmup", "0", "--no-final"]
    done = _cli("tune", str(trace), "--candidates", str(candidates), "-o", str(out), *tune)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "engine restarted before it" in done.stderr
    summary = json.loads((out / "tune.json").read_text())
    for outcome in summary["outcomes"]:
        paths = [p["path"] for p in outcome["probes"]]
        assert len(paths) >= 2
        firsts = []
        for run in load_runs(paths):
            (header,) = run.headers
            assert header.pre_run["erase_slots"] == "failed: HTTP 501"
            assert header.pre_run["cache_start"] == "cache-warm"
            req = run.measures.requests
            firsts.append(int(req.cached_tokens[int(req.sent_ns.argmin())]))
        if outcome["engine"] == "cold":
            assert firsts == [0] * len(firsts), firsts  # every run on a fresh engine
        else:
            assert firsts[0] == 0 and all(f > 0 for f in firsts[1:]), firsts  # the cache outlived runs
