"""`tune` stopped by a signal to its pid (as a service manager sends it) mid-replay: nothing survives.

Every process tune started — the engine, the replay, the replay's preparer and helpers — is seen
while it runs (by parent pid, then by process group); after the signal none of them runs, tune
exited within a bound, and no file appears in the output directory after it exited.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from tests.cli import run_cli
from tests.processes import Proc, finish, running, start_cli, survivors

pytestmark = pytest.mark.slow

SIM = f"{sys.executable} -m replayproxy.sim --port {{port}} --speed 20"
CANDIDATES = f"""
[[engine]]
name = "sim"
command = "{SIM} --max-num-seqs {{max_num_seqs}}"
grid = {{ max_num_seqs = [8] }}
replay_args = ["--model", "sim-llama-3.1-8b"]
start_timeout = 60
stop_timeout = 10
"""
EXIT_WITHIN_S = 20
MAX_RSS_MB = 200


def _descendants(root: int) -> list[Proc]:
    """Every running process below `root`, by parent pid."""
    procs = running()
    found, frontier = [], {root}
    while frontier:
        below = [p for p in procs if p.ppid in frontier]
        found += below
        frontier = {p.pid for p in below}
    return found


def _files(directory: Path) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_size for p in directory.rglob("*") if p.is_file()}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_tune_mid_replay_stops_every_process_it_started(
    tmp_path: Path, sig: signal.Signals
) -> None:
    trace, candidates, out = tmp_path / "w.rpt", tmp_path / "candidates.toml", tmp_path / "tune"
    synth = ["synth", "-o", str(trace), "--requests", "600", "--rate", "10", "--input-len", "fixed:200"]
    assert run_cli(*synth, "--output-len", "fixed:16", "--seed", "1").returncode == 0
    candidates.write_text(CANDIDATES)
    tune = start_cli(
        "tune", str(trace), "--candidates", str(candidates), "-o", str(out), "--slo", "ttft<=500ms",
        "--warmup", "0", "--repeat", "1", "--no-final", out_dir=tmp_path,
    )  # fmt: skip
    seen: dict[int, Proc] = {}
    deadline = time.perf_counter() + 120
    replaying_since = None
    while time.perf_counter() < deadline and tune.poll() is None:
        for p in _descendants(tune.pid):
            seen[p.pid] = p
        replay = [p for p in seen.values() if p.ppid == tune.pid and b"replay" in _cmdline(p.pid)]
        if replay and replaying_since is None:
            replaying_since = time.perf_counter()
        if replaying_since is not None and time.perf_counter() - replaying_since > 4:  # past its preparation
            break
        time.sleep(0.1)
    assert replaying_since is not None, (tmp_path / "stderr.txt").read_text()
    assert len({p.pgid for p in seen.values()}) >= 2  # the engine's group and the replay's
    assert len(seen) >= 3  # engine, replay, and the replay's own children (preparer, trackers)

    sent = time.perf_counter()
    tune.send_signal(sig)
    done = finish(tune, tmp_path)
    took = time.perf_counter() - sent
    left = _files(out)
    assert done.returncode == 130, done.stderr
    assert took < EXIT_WITHIN_S, took
    assert done.max_rss_mb < MAX_RSS_MB, done.max_rss_mb
    assert "Traceback" not in done.stderr and done.stderr.strip().endswith("replayproxy tune: interrupted")
    pids = list(seen)
    assert survivors(pids, groups={p.pgid for p in seen.values()}, parents=[tune.pid]) == []
    time.sleep(3)  # a replay that outlived tune would write its result now
    assert _files(out) == left
    assert survivors(pids, groups={p.pgid for p in seen.values()}) == []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_an_engine_name_that_is_not_a_safe_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for name in ("..", ".hidden", "a/b"):
        candidates = tmp_path / "candidates.toml"
        candidates.write_text(f'[[engine]]\nname = "{name}"\ncommand = "serve --port {{port}}"\n')
        done = run_cli(
            "tune", "w.rpt", "--candidates", str(candidates), "-o", str(tmp_path / "out"), "--slo", "ttft<=1s"
        )
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "'name' must start with a letter or digit" in done.stderr
    assert not (tmp_path / "out").exists()
