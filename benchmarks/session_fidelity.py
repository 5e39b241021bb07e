"""Closed-loop session replay: think-time reproduction and overlaps against a sim slower than production.

    python benchmarks/session_fidelity.py [--sessions 40] [--turns 5] [--think-ms 40] [--sim-speed 0.5]

A multi-turn trace (sessions 250 ms apart; each turn's prompt = the previous prompt, its reply and a
new message; production answered in 60 ms and the next turn came `--think-ms` later) is replayed
against the simulated engine at `--sim-speed` (slower than the recorded 60 ms) in one run: closed
loop with live replies (each later turn built from the sim's reply when the previous turn ends,
through the sim's /tokenize), closed loop with planned replies, and open loop. Printed per mode:
overlapping turns (sent before the previous turn of the session ended), think time as replayed
minus the planned one (p50 / p99 / max, ms) and the schedule lag p99. The replayer runs pinned to
its own core, the sim to another, when there are two.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replayproxy import clock  # noqa: E402
from replayproxy.results import ResultFile, load_results  # noqa: E402
from replayproxy.trace import TraceHeader, write_trace  # noqa: E402
from tests.e2e.test_replay_sessions import session_shapes  # noqa: E402 — the e2e test's trace


def session_trace(path: Path, sessions: int, turns: int, think_ms: int) -> None:
    header = TraceHeader(start_wall_ns=0, source="synth", block_size=16, block_unit="token")
    shapes = session_shapes(sessions, turns, think_ms)
    write_trace(path, header, shapes, mono_ns=clock.now_ns, wall_ns=clock.wall_ns)


def figures(result: ResultFile) -> str:
    index, sent, e2e = (result.column(c) for c in ("index", "sent_ns", "e2e_ns"))
    end_of = dict(zip(index.tolist(), (sent + e2e).tolist(), strict=True))
    after, planned = result.column("after"), result.column("think_ns")
    later = after >= 0
    got = sent[later] - np.array([end_of[a] for a in after[later].tolist()])
    error = (got - planned[later]) / 1e6
    e50, e99 = np.percentile(error, [50, 99])
    lag = (sent - result.column("scheduled_ns")) / 1e6
    return (
        f"overlapping turns {int((got < 0).sum())}/{len(got)}"
        f"  think error ms p50 {e50:.3f} p99 {e99:.3f} max {error.max():.3f}"
        f"  schedule lag ms p50 {np.percentile(lag, 50):.3f} p99 {np.percentile(lag, 99):.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--think-ms", type=int, default=40)
    parser.add_argument("--sim-speed", type=float, default=0.5)
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trace = work / "sessions.rpt"
        session_trace(trace, args.sessions, args.turns, args.think_ms)
        sim = subprocess.Popen(
            [sys.executable, "-m", "replayproxy.sim", "--host", "127.0.0.1", "--port", "0",
             "--speed", str(args.sim_speed)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            assert sim.stdout is not None
            line = sim.stdout.readline()  # "sim listening on http://127.0.0.1:PORT"
            if "listening on " not in line:
                sys.exit(f"session_fidelity: the sim did not start: {line.strip()}")
            url = line.split("listening on ", 1)[1].strip()
            if len(cores) >= 2:
                os.sched_setaffinity(sim.pid, {cores[-1]})
            print(f"{args.sessions} sessions x {args.turns} turns, think {args.think_ms} ms")
            for mode, replies in (("closed", "live"), ("closed", "planned"), ("open", "planned")):
                out = work / f"{mode}-{replies}.rpr"
                command = [sys.executable, "-m", "replayproxy", "replay", str(trace), "--target", url, "-o",
                           str(out), "--flavor", "vllm", "--quiet", "--no-calibrate"]  # fmt: skip
                command += ["--sessions", mode, "--replies", replies]
                pinned = (lambda: os.sched_setaffinity(0, {cores[0]})) if len(cores) >= 2 else None
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL, preexec_fn=pinned)
                print(f"  {mode:6} {replies:7} {figures(load_results([out])[0])}")
        finally:
            sim.terminate()
            sim.wait(10)


if __name__ == "__main__":
    main()
