"""A million-request export under a memory limit: rows are built a chunk at a time, never all at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from replayproxy.trace import TraceHeader, write_columns

ROWS = 1_000_000
PEAK_MB = 500
# Run in a child: an address-space cap turns runaway growth into a failure, ru_maxrss measures the peak.
CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from replayproxy import cli
code = cli.main(sys.argv[1:])
print("peak_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
sys.exit(code)
"""


def million_request_trace(path: Path) -> Path:
    """1M requests of two 512-token blocks, all sharing the first (a system prompt)."""
    rng = np.random.default_rng(0)
    inputs = rng.integers(1024, 1535, ROWS)
    hashes = rng.integers(1, 2**63, 2 * ROWS).astype(np.uint64)
    hashes[::2] = 7
    columns = {
        "offset_ns": np.cumsum(rng.integers(1, 2_000_000, ROWS)),
        "input_tokens": inputs,
        "output_tokens": rng.integers(1, 500, ROWS),
        "status": 200,
        "prefix_hashes": (hashes, np.full(ROWS, 2)),
        "prefix_units": inputs,
    }
    header = TraceHeader(start_wall_ns=0, source="test", block_size=512, block_unit="token")
    write_columns(path, header, columns, ROWS, wall_ns=lambda: 0)
    return path


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["mooncake", "burstgpt"])
def test_million_row_export_stays_under_500_mb(tmp_path: Path, fmt: str) -> None:
    trace = million_request_trace(tmp_path / "big.rpt")
    out = tmp_path / f"big.{fmt}"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", CHILD, "export", str(trace), "-f", fmt, "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"wrote {ROWS} requests" in run.stdout
    peak = int(run.stdout.split("peak_mb")[-1])
    assert peak < PEAK_MB, f"peak {peak} MB"
    with open(out, "rb") as stream:
        assert sum(1 for _ in stream) == ROWS + (fmt == "burstgpt")  # every row written (+ the header)
