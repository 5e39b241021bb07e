"""replayproxy (recording on) against nginx as an aiohttp streaming client sees them, with the budget.

proxy_overhead.py runs this as one section of its run: direct, nginx (`proxy_buffering off`) and
replayproxy with its defaults all stay up while rounds rotate through them, for two stream shapes
(64 chunks in one burst; 32 chunks 5 ms apart). An aiohttp client in its own process sends an open
loop of streaming requests and times the first body bytes (`iter_any`) and the end. Added TTFT is
against direct in the same rounds; CPU is the proxy process's user + system seconds for that load,
its children's (nginx's worker, replayproxy's recorder process) included; calls/req is their read
and write system calls per streamed request (/proc/PID/io), since CPU follows how finely a path
splits the same bursts into reads and writes.
Budget: added TTFT p50 <= 1.5x nginx's and p99 <= 2x in both shapes, CPU <= 2x nginx's.

A ratio to an added figure near zero says nothing (nginx adds ~0.00 ms at p50 on the burst shape),
so each added-TTFT ratio is taken against nginx's figure or a floor, whichever is larger: the
spread of direct's own figure between rounds (how far the same path moves in one run), and at
least 0.05 ms. The absolute figures are printed beside it, and a floored ratio says so.

    python benchmarks/overhead_budget.py --role aioload --port P --rate R --duration S --shape burst
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from replayproxy.clock import now_ns
from replayproxy.tasks import spawn

PATHS = ("direct", "nginx", "replayproxy+rec", "replayproxy+rec-cpu1", "replayproxy")
# The budget compares nginx and replayproxy on the same one CPU. Two paths beside it, not in the
# verdict: the recorder process on CPU 1 (--recorder-cpus 1: shared with the upstream and the load
# generator), the placement a sidecar with a second core would use, its CPU counting both processes;
# and recording off (--no-record), what the forwarding loop alone costs.
BESIDE = {
    "replayproxy+rec-cpu1": "recorder process on CPU 1 (--recorder-cpus 1)",
    "replayproxy": "recording off (--no-record)",
}
SHAPES = {"burst": "64 chunks in one burst", "paced": "32 chunks 5 ms apart"}
BUDGET = {"p50": 1.5, "p99": 2.0, "cpu": 2.0}
MIN_FLOOR_MS = 0.05  # the least floor under nginx's added TTFT (see the module docstring)
BODY = json.dumps(
    {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "Go. " * 40}]}
).encode()

StartPath = Callable[[str], AbstractContextManager[tuple[int, int | None]]]


async def _aio_load(port: int, rate: float, duration_s: float, shape: str) -> dict[str, Any]:
    """Open loop: request i starts at start + i / rate, whatever earlier answers did."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions?shape={shape}"
    results: list[tuple[int, int, bool]] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            sent = now_ns()
            first = 0
            try:
                async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as resp:
                    async for _ in resp.content.iter_any():
                        if not first:
                            first = now_ns()
                    results.append((first - sent, now_ns() - sent, resp.status == 200 and first > 0))
            except aiohttp.ClientError:
                results.append((0, 0, False))

        await asyncio.gather(*(one() for _ in range(16)))  # warm connections
        results.clear()
        tasks = []
        start = now_ns()
        for i in range(int(rate * duration_s)):
            wait = start + int(i * 1e9 / rate) - now_ns()
            if wait > 0:
                await asyncio.sleep(wait / 1e9)
            tasks.append(spawn(one(), name="bench-request"))
        await asyncio.gather(*tasks)
    return {
        "ok": sum(ok for _, _, ok in results),
        "sent": len(tasks),
        "ttft_ns": [r[0] for r in results if r[2]],
        "e2e_ns": [r[1] for r in results if r[2]],
    }


def _run_aio_load(port: int, rate: float, duration_s: float, shape: str, cpu: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        argv = [sys.executable, __file__, "--role", "aioload", "--port", str(port), "--rate", str(rate),
                "--duration", str(duration_s), "--shape", shape, "--out", out.name]  # fmt: skip
        done = subprocess.run(
            argv, capture_output=True, text=True, preexec_fn=lambda: os.sched_setaffinity(0, {cpu})
        )
        if done.returncode != 0:
            raise RuntimeError(f"aiohttp load generator failed:\n{done.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(Path(out.name).read_text())
        return result


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6 if ordered else float("nan")


def report_budget(
    start_path: StartPath,
    usage: Callable[[int], tuple[float, int]],
    rate: float,
    duration_s: float,
    rounds: int,
) -> bool:
    """Measure and print; True when every figure is within budget."""
    print(
        f"\naiohttp streaming client, {rate:g} req/s, {duration_s:g} s per path and shape, {rounds} rounds"
        " rotating direct / nginx / replayproxy (recording on, defaults) / the same with its recorder"
        " process on CPU 1 / recording off:"
    )
    ttft: dict[tuple[str, str], list[int]] = {(s, p): [] for s in SHAPES for p in PATHS}
    cpu: dict[tuple[str, str], float] = dict.fromkeys(ttft, 0.0)
    calls: dict[tuple[str, str], float] = dict.fromkeys(ttft, 0.0)  # read + write calls per request
    failed: dict[tuple[str, str], int] = dict.fromkeys(ttft, 0)
    direct_rounds: dict[str, list[list[int]]] = {shape: [] for shape in SHAPES}  # for the floor
    with ExitStack() as stack:
        ports = {name: stack.enter_context(start_path(name)) for name in PATHS}
        for shape in SHAPES:
            for port, _ in ports.values():  # warm-up: connections, caches, the recorder process
                _run_aio_load(port, rate, 1.0, shape, 1)
        for round_ in range(rounds):
            for shape in SHAPES:
                order = PATHS[round_ % len(PATHS) :] + PATHS[: round_ % len(PATHS)]
                for name in order:
                    port, pid = ports[name]
                    before = usage(pid) if pid else (0.0, 0)
                    result = _run_aio_load(port, rate, duration_s, shape, 1)
                    after = usage(pid) if pid else (0.0, 0)
                    cpu[shape, name] += after[0] - before[0]
                    calls[shape, name] += (after[1] - before[1]) / max(1, result["ok"]) / rounds
                    ttft[shape, name] += result["ttft_ns"]
                    if name == "direct":
                        direct_rounds[shape].append(result["ttft_ns"])
                    failed[shape, name] += result["sent"] - result["ok"]
    within = True
    header = f"{'TTFT p50':>9} {'p99':>7} {'+p50':>7} {'+p99':>7} {'CPU s':>6} {'calls/req':>9} {'failed':>6}"
    print(f"  {'shape':22} {'path':21} {header}")
    for shape, label in SHAPES.items():
        base50, base99 = _pct(ttft[shape, "direct"], 0.5), _pct(ttft[shape, "direct"], 0.99)
        added: dict[str, tuple[float, float]] = {}
        for name in PATHS:
            p50, p99 = _pct(ttft[shape, name], 0.5), _pct(ttft[shape, name], 0.99)
            added[name] = (p50 - base50, p99 - base99)
            print(
                f"  {label:22} {name:21} {p50:>8.3f}m {p99:>6.2f}m {added[name][0]:>+6.3f}m "
                f"{added[name][1]:>+6.2f}m {cpu[shape, name]:>6.2f} {calls[shape, name]:>9.2f}"
                f" {failed[shape, name]:>6}"
            )
        floors = [_floor(direct_rounds[shape], q) for q in (0.5, 0.99)]
        cells, ok = _verdict(added["replayproxy+rec"], added["nginx"], floors, cpu, shape, "replayproxy+rec")
        within &= ok
        print(f"  {label}:\n    " + "\n    ".join(cells))
        for name, what in BESIDE.items():
            cells, _ = _verdict(added[name], added["nginx"], floors, cpu, shape, name)
            print(f"    beside the budget, {what}: " + "; ".join(cells))
    return within


def _verdict(
    ours: tuple[float, float],
    nginx: tuple[float, float],
    floors: list[float],
    cpu: dict[tuple[str, str], float],
    shape: str,
    name: str,
) -> tuple[list[str], bool]:
    """One path's ratios to nginx beside the budget, and whether all are within it."""
    cells, within = [], True
    for index, key in enumerate(("p50", "p99")):
        floor = floors[index]
        ratio = _ratio(ours[index], max(nginx[index], floor))
        ok = ratio <= BUDGET[key]
        within &= ok
        against = "nginx" if nginx[index] >= floor else f"the {floor:.3f} ms floor"
        against += "" if nginx[index] >= floor else f" (nginx {nginx[index]:+.3f})"
        cells.append(
            f"added TTFT {key} {ours[index]:+.3f} ms = {ratio:.2f}x {against}"
            f" (budget <= {BUDGET[key]:g}x: {'ok' if ok else 'OVER'})"
        )
    ratio = _ratio(cpu[shape, name], cpu[shape, "nginx"])
    ok = ratio <= BUDGET["cpu"]
    cells.append(f"CPU {ratio:.2f}x nginx (budget <= {BUDGET['cpu']:g}x: {'ok' if ok else 'OVER'})")
    return cells, within and ok


def _floor(rounds: list[list[int]], q: float) -> float:
    """The least added TTFT (ms) a ratio is taken against: how far direct's own percentile moved
    between rounds of this run, and at least MIN_FLOOR_MS."""
    figures = [_pct(r, q) for r in rounds if r]
    return max(MIN_FLOOR_MS, max(figures) - min(figures) if len(figures) > 1 else 0.0)


def _ratio(ours: float, against: float) -> float:
    """ours / against; adding nothing is a ratio of 0, something against nothing an infinite one."""
    if ours <= 0:
        return 0.0
    return ours / against if against > 0 else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--role", choices=["aioload"], required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="burst")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = uvloop.run(_aio_load(args.port, args.rate, args.duration, args.shape))
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
