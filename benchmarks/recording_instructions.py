"""Recording's cost in instructions per stream, per thread: a figure that shared machines do not blur.

CPU time on a shared VM moves by ±20% between identical runs (BENCHMARKS.md), more than most
changes to the recorder. Instructions counted by callgrind repeat to within a percent whatever
else runs, so this script puts the proxy under `valgrind --tool=callgrind`, with recording off,
then at each of proxy_overhead.py's steps to recording on (`CPU_STEPS`), and counts the
instructions that each of its threads spends per streamed request (the same 64-chunk requests as
benchmarks/proxy_overhead.py, from its upstream and load generator).
Instructions are not time: cache misses are not counted, so this tells which code costs what,
and proxy_overhead.py tells what it costs on the machine.

Under callgrind the proxy runs ~50x slower, so the load is 10 req/s; the trace writer's flush
interval is raised to 20 s so that a frame holds ~200 records, as it does at 200 req/s. What the
threads spend idle (the pipe's timer runs 50 times a second) is counted over a second window
of the same length without load and taken off, so the figures do not depend on the rate.
Recording runs in a recorder process (proxy/recording/recorder.py); callgrind follows it too
(`--trace-children`), and its instructions are shown beside the proxy process's own.

    python benchmarks/recording_instructions.py              # 100 streams per variant, about 3 minutes
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import proxy_overhead as bench

from replayproxy.clock import now_ns

_COUNT = re.compile(rb"^(?:summary|totals): (\d+)", re.M)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=100, help="streamed requests counted per variant")
    parser.add_argument("--rate", type=float, default=10.0, help="requests per second (callgrind is slow)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("recording_instructions: valgrind (with callgrind_control) is not installed")
    os.environ["REPLAYPROXY_PROXY_FLUSH_INTERVAL_S"] = "20"  # frames of ~200 records, as at 200 req/s
    upstream = bench._free_port()
    argv = [sys.executable, bench.__file__, "--role", "upstream", "--port", str(upstream), "--gap-ms", "1"]
    with tempfile.TemporaryDirectory() as tmp, bench._process(argv, 1, "upstream ready"):
        counts = {name: _count(Path(tmp), upstream, name, args.streams, args.rate) for name in _STEPS}
    print(f"{args.streams} streams of {bench.CHUNKS} chunks at {args.rate:g} req/s, instructions per stream:")
    loop_off = counts["replayproxy"][0][0]
    for name, label in _STEPS.items():
        (loop, *others), child = counts[name]
        line = f"  {label:42} event loop {loop / 1e3:>6,.0f}k"
        if name != "replayproxy":
            line += f" (+{(loop - loop_off) / 1e3:,.0f}k), other threads {sum(others) / 1e3:,.0f}k, "
            line += f"recorder process {child / 1e3:,.0f}k, "
            line += f"all / recording off {(loop + sum(others) + child) / loop_off:.3f}"
        print(line)
    print("  (user-space instructions only: the kernel's share of the CPU is not counted)")


_STEPS = {"replayproxy": "recording off", **bench.CPU_STEPS}


def _count(work: Path, upstream: int, name: str, streams: int, rate: float) -> tuple[list[float], float]:
    """Instructions per stream of each proxy thread that did work (the event loop first), and of
    its recorder process (all threads)."""
    out = work / name.replace("+", "-")
    port = bench._free_port()
    argv = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--trace-children=yes",
            f"--callgrind-out-file={out}.%p", *bench.proxy_argv(name, port, upstream, work)]  # fmt: skip
    traces = work / "traces"
    before = len(list(traces.glob("*.rpt")))
    with bench._process(argv, 0, "proxy listening on") as proc:
        bench._run_load(port, rate, 2.0, 1)  # warm-up: connections, imports, caches
        child = _recorder_process(proc.pid, traces, before) if name.startswith("replayproxy+rec") else None
        pids = [proc.pid] + ([child] if child else [])
        time.sleep(1.0)
        _callgrind("-z", *pids)
        started = now_ns()
        result = bench._run_load(port, rate, streams / rate, 1)
        time.sleep(1.5)  # the pipe's timer runs every 20 ms, the recorder process reads as it comes
        loaded_s = (now_ns() - started) / 1e9
        _callgrind("-d", *pids)  # part 1: the load
        _callgrind("-z", *pids)
        time.sleep(loaded_s)
        _callgrind("-d", *pids)  # part 2: as long, idle
    if result["ok"] != result["sent"]:
        sys.exit(f"recording_instructions: {result['sent'] - result['ok']} requests failed")
    ok = result["ok"]
    loaded, idle = _per_thread(work, out.name, proc.pid, 1), _per_thread(work, out.name, proc.pid, 2)
    counts = [(loaded[thread] - idle.get(thread, 0)) / ok for thread in sorted(loaded)]
    recorder = 0.0
    if child:
        busy, quiet = _per_thread(work, out.name, child, 1), _per_thread(work, out.name, child, 2)
        recorder = (sum(busy.values()) - sum(quiet.values())) / ok
    return [counts[0], *(c for c in counts[1:] if c > 1000)], recorder


def _recorder_process(pid: int, traces: Path, before: int) -> int:
    """The proxy's recorder process, once it has written the warm-up's records (it starts slowly
    under callgrind, and what it does before that must not be counted)."""
    deadline = now_ns() + 300 * 10**9
    while now_ns() < deadline:
        children = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat")
                    if _parent(p) == pid]  # fmt: skip
        if children and len(list(traces.glob("*.rpt"))) > before:
            return children[0]
        time.sleep(0.5)
    sys.exit("recording_instructions: the recorder process did not start writing")


def _parent(stat: Path) -> int:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _callgrind(option: str, *pids: int) -> None:
    for pid in pids:
        subprocess.run(["callgrind_control", option, str(pid)], check=True, capture_output=True)


def _per_thread(work: Path, name: str, pid: int, part: int) -> dict[str, int]:
    """Instructions of each thread of a process in one dump (callgrind writes NAME.PID.PART-THREAD)."""
    counts = {}
    for path in work.glob(f"{name}.{pid}.{part}-*"):
        found = _COUNT.search(path.read_bytes())
        counts[path.name.rsplit("-", 1)[1]] = int(found.group(1)) if found else 0
    return counts


if __name__ == "__main__":
    main()
