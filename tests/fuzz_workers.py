"""Fuzz tests that run their cases in worker processes (each under its own address-space limit,
one core each): a worker is the test's own file run as a script over a share of the cases,
printing a JSON summary (`outcomes`, `failures`) on its last line, which the test merges."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_workers(
    script: str, mutations: int, jobs: Sequence[tuple[int, str]], timeout_s: float
) -> dict[str, Counter[str]]:
    """Run `script MUTATIONS SEED NAMES` for each (seed, names) job at once; the merged summaries.
    Every worker is stopped, whatever happens."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    workers = [
        subprocess.Popen(
            [sys.executable, script, str(mutations), str(seed), names],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for seed, names in jobs
    ]  # fmt: skip
    summary: dict[str, Counter[str]] = {"outcomes": Counter(), "failures": Counter()}
    try:
        for process in workers:
            out, err = process.communicate(timeout=timeout_s)
            assert process.returncode == 0, err[-3000:]
            part = json.loads(out.strip().splitlines()[-1])
            for key in summary:
                summary[key].update(part[key])
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
                process.wait()
    return summary
