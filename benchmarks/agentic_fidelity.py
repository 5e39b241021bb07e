"""Agent sessions recorded through the proxy and replayed closed loop against the same sim.

    python benchmarks/agentic_fidelity.py [--sessions 24] [--fan-out 8] [--depth 5] [--sim-speed 10]

Sessions (fan-out 1..N parallel calls per step, 1..D steps, each step joined by a request quoting
or returning the answers, tool waits log-normal with a median of 20 ms) are sent with live replies
through the recording proxy in front of the sim, then the trace is replayed (`--sessions closed`,
live replies) against the same sim. Printed: edges violated (a request sent before a reply it waits
for ended; target 0), release-time error p99 (send − release deadline, ms; target <= 2), session
makespan p50 / p95 replayed vs recorded (target within 5 %), cached tokens per call replayed vs
recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replayproxy import trace  # noqa: E402
from replayproxy.cli import main as cli  # noqa: E402
from replayproxy.results import load_results  # noqa: E402
from tests.agents import AgentClient, random_sessions  # noqa: E402 — the e2e tests' agent client
from tests.e2e.test_agent_replay import edges  # noqa: E402
from tests.servers import sim, start_proxy  # noqa: E402


def makespans(session: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    keys = np.unique(session)
    return np.array([end[session == k].max() - start[session == k].min() for k in keys]) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--fan-out", type=int, default=8)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--sim-speed", default="10")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sessions = random_sessions(random.Random(args.seed), args.sessions, args.fan_out, args.depth)
    with tempfile.TemporaryDirectory() as tmp:
        traces, out = Path(tmp) / "traces", Path(tmp) / "replay.rpr"
        with sim("--speed", args.sim_speed) as engine:
            with start_proxy(engine.url, traces) as proxy:
                asyncio.run(AgentClient(proxy.url).run(sessions))
                proxy.stop()
            paths = sorted(traces.glob("*.rpt"))
            options = [
                "--flavor",
                "vllm",
                "--quiet",
                "--no-calibrate",
                "--sessions",
                "closed",
                "--replies",
                "live",
            ]
            code = cli(["replay", *map(str, paths), "--target", engine.url, "-o", str(out), *options])
        if code != 0:
            sys.exit(code)
        cols = trace.load(paths)
        result = load_results([out])[0]
    index, sent, e2e = (result.column(c) for c in ("index", "sent_ns", "e2e_ns"))
    at = {int(i): k for k, i in enumerate(index.tolist())}
    violated = sum(1 for dep, row in edges(cols) if sent[at[row]] < sent[at[dep]] + e2e[at[dep]])
    lag = (sent - result.column("scheduled_ns")) / 1e6
    session = cols.session[index]
    recorded = makespans(session, cols.offset_ns[index], cols.offset_ns[index] + cols.e2e_ns[index])
    replayed = makespans(session, sent, sent + e2e)
    cached_rec, cached_rep = cols.cached_tokens[index], result.column("cached_tokens")
    known = (cached_rec >= 0) & (cached_rep >= 0)
    print(f"requests {len(index)}  sessions {len(recorded)}  edges {len(edges(cols))}")
    print(f"edges violated {violated}")
    print(f"release-time error ms  p50 {np.percentile(lag, 50):.3f}  p99 {np.percentile(lag, 99):.3f}")
    for q in (50, 95):
        a, b = np.percentile(replayed, q), np.percentile(recorded, q)
        print(f"makespan p{q} ms  replay {a:.1f}  recorded {b:.1f}  ratio {a / b:.3f}")
    if known.any():
        rep, rec = cached_rep[known].mean(), cached_rec[known].mean()
        print(
            f"cached tokens per call  replay {rep:.1f}  recorded {rec:.1f}  ratio {rep / max(rec, 1e-9):.3f}"
        )


if __name__ == "__main__":
    main()
