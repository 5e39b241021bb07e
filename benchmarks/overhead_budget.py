"""replayproxy (recording on) against nginx as an aiohttp streaming client sees them, with the budget.

proxy_overhead.py runs this as one section of its run: direct, nginx (`proxy_buffering off`) and
replayproxy with its defaults all stay up while rounds rotate through them, for two stream shapes
(64 chunks in one burst; 32 chunks 5 ms apart). An aiohttp client in its own process sends an open
loop of streaming requests and times the first body bytes (`iter_any`) and the end. Added TTFT is
against direct in the same rounds; CPU is the proxy process's user + system seconds for that load.
Budget: added TTFT p50 <= 1.5x nginx's and p99 <= 2x in both shapes, CPU <= 2x nginx's.

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

PATHS = ("direct", "nginx", "replayproxy+rec")
SHAPES = {"burst": "64 chunks in one burst", "paced": "32 chunks 5 ms apart"}
BUDGET = {"p50": 1.5, "p99": 2.0, "cpu": 2.0}
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
    start_path: StartPath, cpu_s: Callable[[int], float], rate: float, duration_s: float, rounds: int
) -> bool:
    """Measure and print; True when every figure is within budget."""
    print(
        f"\naiohttp streaming client, {rate:g} req/s, {duration_s:g} s per path and shape, {rounds} rounds"
        " rotating direct / nginx / replayproxy (recording on, defaults):"
    )
    ttft: dict[tuple[str, str], list[int]] = {(s, p): [] for s in SHAPES for p in PATHS}
    cpu: dict[tuple[str, str], float] = dict.fromkeys(ttft, 0.0)
    failed: dict[tuple[str, str], int] = dict.fromkeys(ttft, 0)
    with ExitStack() as stack:
        ports = {name: stack.enter_context(start_path(name)) for name in PATHS}
        for shape in SHAPES:
            for port, _ in ports.values():  # warm-up: connections, caches, the recorder thread
                _run_aio_load(port, rate, 1.0, shape, 1)
        for round_ in range(rounds):
            for shape in SHAPES:
                order = PATHS[round_ % len(PATHS) :] + PATHS[: round_ % len(PATHS)]
                for name in order:
                    port, pid = ports[name]
                    before = cpu_s(pid) if pid else 0.0
                    result = _run_aio_load(port, rate, duration_s, shape, 1)
                    cpu[shape, name] += (cpu_s(pid) - before) if pid else 0.0
                    ttft[shape, name] += result["ttft_ns"]
                    failed[shape, name] += result["sent"] - result["ok"]
    within = True
    header = f"{'TTFT p50':>9} {'p99':>7} {'+p50':>7} {'+p99':>7} {'CPU s':>6} {'failed':>6}"
    print(f"  {'shape':22} {'path':16} {header}")
    for shape, label in SHAPES.items():
        base50, base99 = _pct(ttft[shape, "direct"], 0.5), _pct(ttft[shape, "direct"], 0.99)
        added: dict[str, tuple[float, float]] = {}
        for name in PATHS:
            p50, p99 = _pct(ttft[shape, name], 0.5), _pct(ttft[shape, name], 0.99)
            added[name] = (p50 - base50, p99 - base99)
            print(
                f"  {label:22} {name:16} {p50:>8.3f}m {p99:>6.2f}m {added[name][0]:>+6.3f}m "
                f"{added[name][1]:>+6.2f}m {cpu[shape, name]:>6.2f} {failed[shape, name]:>6}"
            )
        ours, nginx = added["replayproxy+rec"], added["nginx"]
        ratios = {
            "p50": _ratio(ours[0], nginx[0]),
            "p99": _ratio(ours[1], nginx[1]),
            "cpu": _ratio(cpu[shape, "replayproxy+rec"], cpu[shape, "nginx"]),
        }
        cells = []
        for key, ratio in ratios.items():
            ok = ratio <= BUDGET[key]
            within &= ok
            name = {"p50": "added TTFT p50", "p99": "added TTFT p99", "cpu": "CPU"}[key]
            cells.append(f"{name} {ratio:.2f}x nginx (budget <= {BUDGET[key]:g}x: {'ok' if ok else 'OVER'})")
        print(f"  {label}: " + "; ".join(cells))
    return within


def _ratio(ours: float, nginx: float) -> float:
    """ours / nginx; nginx adding nothing measurable makes any cost of ours infinitely more."""
    return ours / nginx if nginx > 0 else (0.0 if ours <= 0 else float("inf"))


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
