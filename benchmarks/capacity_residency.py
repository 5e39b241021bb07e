"""KV residency sweep of `replayproxy capacity` on 1,000,000 requests, with side-by-side baselines.

Synthetic timings of an hour of traffic (1M requests, up to 50 chunk gaps each). Printed: the
sweep with linear progress, the sweep following chunk times, the p95 bisection, and as the floor
any event sweep pays, one argsort of the same number of event times; ratios are against that floor.

    .venv/bin/python benchmarks/capacity_residency.py [--requests 1000000]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from replayproxy.capacity.residency import CHUNK_POINTS, Timings, residency


def timings(requests: int, seed: int = 1) -> Timings:
    rng = np.random.default_rng(seed)
    outputs = rng.integers(1, 1000, requests)
    ttft = rng.integers(10**8, 10**9, requests)
    gaps_per_request = np.minimum(outputs - 1, 50)
    index = np.concatenate([[0], np.cumsum(gaps_per_request)]).astype(np.int64)
    return Timings(
        arrival_ns=np.sort(rng.integers(0, 3600 * 10**9, requests)),
        ttft_ns=ttft,
        e2e_ns=ttft + outputs * 30 * 10**6,
        input_tokens=rng.integers(10, 8000, requests),
        output_tokens=outputs,
        chunk_gaps_us=rng.integers(1000, 60000, int(index[-1])),
        chunk_index=index,
    )


def clocked(label: str, fn: object, floor_s: float | None = None) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()  # type: ignore[operator]
    took = time.perf_counter() - start
    ratio = f"  ({took / floor_s:.1f}x the argsort floor)" if floor_s else ""
    print(f"{label:<42} {took:7.2f} s{ratio}")
    return took, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1_000_000)
    n = parser.parse_args().requests
    chunked = timings(n)
    linear = replace(chunked, chunk_gaps_us=np.zeros(0, np.int64), chunk_index=np.zeros(n + 1, np.int64))
    events_chunked = n * (CHUNK_POINTS + 3)
    rng = np.random.default_rng(2)
    floor_s, _ = clocked(
        f"argsort of {events_chunked:,} int64 times",
        lambda: np.argsort(rng.integers(0, 2**62, events_chunked)),
    )
    clocked(f"sweep, linear progress ({n:,} requests)", lambda: residency(linear), floor_s)
    _, curve = clocked(
        f"sweep, chunk times ({CHUNK_POINTS} segments each)", lambda: residency(chunked), floor_s
    )
    clocked("p95 over time (bisection)", lambda: curve.quantile(0.95), floor_s)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
