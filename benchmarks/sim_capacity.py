"""How much streaming load the simulated engine sustains on one core (its budget: >= 500 concurrent
streams and >= 20k emitted chunks/s), so it is never the bottleneck of proxy and replayer tests.

Starts `python -m replayproxy.sim --port 0` on 127.0.0.1 in a subprocess with a fast time scale,
keeps CONCURRENCY streaming requests in flight with aiohttp for DURATION seconds, counts SSE events
received, and reads the sim's CPU time from /proc (the sim is one thread, so CPU% <= 100 means one
core). Prints the figures and exits; nothing here is collected by pytest.

    python benchmarks/sim_capacity.py [--concurrency 500] [--duration 10] [--tokens 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import aiohttp
import orjson
import uvloop


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def worker(
    session: aiohttp.ClientSession, url: str, body: bytes, stop_at: float, counts: dict[str, int]
) -> None:
    while time.perf_counter() < stop_at:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
            resp.raise_for_status()
            async for data in resp.content.iter_any():
                counts["events"] += data.count(b"data: ")
        counts["requests"] += 1


async def drive(base: str, pid: int, concurrency: int, duration: float, tokens: int) -> dict[str, float]:
    """Full load for `duration` seconds; the figures are taken over that window, before the drain."""
    body = orjson.dumps(
        {
            "messages": [{"role": "user", "content": "benchmark the simulated engine"}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
        }
    )
    counts = {"events": 0, "requests": 0}
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        stop_at = t0 + duration
        workers = asyncio.gather(
            *(
                worker(session, f"{base}/v1/chat/completions", body, stop_at, counts)
                for _ in range(concurrency)
            )
        )
        await asyncio.sleep(duration)
        window = {"wall": time.perf_counter() - t0, "cpu": cpu_seconds(pid) - cpu0, **counts}
        await workers
    return window


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    parser.add_argument("--tokens", type=int, default=200, help="max_tokens of each stream (ignore_eos)")
    parser.add_argument("--speed", type=float, default=20.0, help="sim time scale")
    args = parser.parse_args()
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayproxy.sim",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--speed",
            str(args.speed),
            "--max-num-seqs",
            str(2 * args.concurrency),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sim.stdout is not None
        line = sim.stdout.readline()
        if not line.startswith("sim listening on "):
            print(f"sim did not start: {line!r}", file=sys.stderr)
            return 1
        base = line.split()[-1]
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            w = runner.run(drive(base, sim.pid, args.concurrency, args.duration, args.tokens))
    finally:
        sim.terminate()
        sim.wait(timeout=10)
    print(
        f"sim capacity: {args.concurrency} concurrent streams, {args.tokens} tokens each, "
        f"1 token per chunk, speed {args.speed:g}, {w['wall']:.1f} s window at full load"
    )
    print(f"  requests completed : {w['requests']:.0f}")
    print(f"  SSE events received: {w['events']:.0f}  ({w['events'] / w['wall']:,.0f}/s)")
    print(f"  sim CPU            : {w['cpu']:.1f} s = {100 * w['cpu'] / w['wall']:.0f}% of one core")
    print(f"  events per sim CPU-second: {w['events'] / max(w['cpu'], 1e-9):,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
