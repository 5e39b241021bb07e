"""Million-request exports and imports under a memory limit: rows are built a chunk at a time, never
all at once; text-prompt exports write each prompt as it is synthesized."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from replayproxy.formats.registry import exporters
from tests.formats.helpers import hashed_trace

ROWS = 1_000_000
PEAK_MB = 500
# Run in a child: an address-space cap turns runaway growth into a failure, and the child's own
# high-water mark (VmHWM) measures the peak. Not ru_maxrss: Linux carries it over from the forked
# parent across exec, so a child of a large pytest process would report the parent's size.
CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from replayproxy import cli
code = cli.main(sys.argv[1:])
status = open("/proc/self/status").read()
print("peak_mb", int(status.split("VmHWM:")[1].split()[0]) // 1024)
sys.exit(code)
"""


def million_request_trace(path: Path, rows: int = ROWS) -> Path:
    """1M requests of two 512-token blocks, all sharing the first (a system prompt)."""
    rng = np.random.default_rng(0)
    inputs = rng.integers(1024, 1535, rows)
    hashes = rng.integers(1, 2**63, 2 * rows).astype(np.uint64)
    hashes[::2] = 7
    return hashed_trace(path, hashes, 2, inputs, block=512)


@pytest.fixture(scope="module")
def million_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One million-request trace for the module's tests, which only read it (built once: seconds)."""
    return million_request_trace(tmp_path_factory.mktemp("scale") / "big.rpt")


def run_limited(*args: str) -> tuple[str, int]:
    """The CLI in a child under an address-space cap; its output and peak resident memory (MB)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout, int(run.stdout.split("peak_mb")[-1])


def line_count(path: Path) -> int:
    with open(path, "rb") as stream:
        return sum(1 for _ in stream)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["mooncake", "bailian", "burstgpt", "jsonl"])
def test_million_row_export_stays_under_500_mb(million_trace: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / f"big.{fmt}"
    stdout, peak = run_limited("export", str(million_trace), "-f", fmt, "-o", str(out))
    assert f"wrote {ROWS} requests" in stdout
    assert peak < PEAK_MB, f"peak {peak} MB"
    assert line_count(out) == ROWS + (fmt == "burstgpt")  # every row written (+ the header)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_million_row_jsonl_import_stays_under_500_mb(million_trace: Path, tmp_path: Path) -> None:
    """Lines are parsed a batch at a time: no million dicts at once (512-token blocks keep the ids,
    8 bytes per block in any trace, small beside the rows)."""
    source = tmp_path / "big.jsonl"
    run_limited("export", str(million_trace), "-f", "jsonl",
                "--block-size", "512", "-o", str(source))  # fmt: skip
    back = tmp_path / "back.rpt"
    stdout, peak = run_limited("import", str(source), "-f", "jsonl", "--block-size", "512", "-o", str(back))
    assert f"imported {ROWS} requests" in stdout
    assert peak < PEAK_MB, f"peak {peak} MB"
    # read back in a child too: loading a million rows here would grow this process, and a child
    # forked from it later would report that size as its own peak (ru_maxrss survives exec)
    stats = json.loads(run_limited("inspect", "--json", str(back))[0].split("peak_mb")[0])
    assert stats["requests"] == ROWS and stats["prefix_reuse"] > 0.3  # the shared first block


def million_mooncake_lines(path: Path, rows: int = ROWS) -> Path:
    """Mooncake rows of 4-6 blocks sharing a first id; every tenth row is a later session turn with
    a delay, and every thousandth arrives early (so the import has to reorder)."""
    rng = np.random.default_rng(1)
    inputs = rng.integers(1600, 3000, rows)
    with open(path, "wb") as out:
        for i, n in enumerate(inputs.tolist()):
            ids = [0, *range(8 * i + 1, 8 * i + (n + 511) // 512)]
            stamp = i * 3 - (5_000 if i % 1000 == 999 else 0)
            if i % 10 == 9:
                line = f'{{"session_id": "s{i % 5000}", "delay": 500, "input_length": {n}'
            else:
                line = f'{{"timestamp": {stamp}, "input_length": {n}'
            out.write(f'{line}, "output_length": {i % 400 + 1}, "hash_ids": {ids}}}\n'.encode())
    return path


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_million_row_mooncake_import_with_sessions_stays_under_500_mb(tmp_path: Path) -> None:
    """Hash ids are chained a batch at a time and the chains leave memory for a temporary file;
    session turns keep only each session's latest turn between batches."""
    source = million_mooncake_lines(tmp_path / "big.jsonl")
    back = tmp_path / "back.rpt"
    stdout, peak = run_limited("import", str(source), "-f", "mooncake", "-o", str(back))
    assert f"imported {ROWS} requests" in stdout
    assert peak < PEAK_MB, f"peak {peak} MB"
    stats = json.loads(run_limited("inspect", "--json", str(back))[0].split("peak_mb")[0])
    assert stats["requests"] == ROWS and stats["prefix_reuse"] > 0.01  # the shared first block


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["vllm-custom", "aiperf", "aiperf-dag"])
def test_text_prompt_exports_write_each_prompt_as_it_comes(tmp_path: Path, fmt: str) -> None:
    """20,000 prompts of ~1,300 words are ~135 MB of text (and as much again in request bodies):
    holding them all would pass 300 MB; written one by one the export stays near the start-up size."""
    rows = 20_000
    trace = million_request_trace(tmp_path / "t.rpt", rows)
    out = tmp_path / "prompts.jsonl"
    stdout, peak = run_limited("export", str(trace), "-f", fmt, "-o", str(out))
    assert f"wrote {rows} requests" in stdout
    assert out.stat().st_size > 100 << 20
    assert peak < 200, f"peak {peak} MB"
    assert line_count(out) == rows


LONG_ROWS = 125_000
LONG_BLOCKS = 192  # 24 M hashes, as many as a million requests of 24 blocks (12k-token prompts)
# jsonl is left to the million-row test: 24 M ids as prefix segments take minutes to write
HASH_EXPORTS = ["mooncake", "csv", "parquet", "profile", "azure"]


@pytest.fixture(scope="module")
def long_prompt_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 M prefix hashes (190 MB) over 125,000 requests; each hash is drawn from a pool of half
    as many, so most recur (7 M recurring hashes: the shared-id table's worst case)."""
    rng = np.random.default_rng(1)
    inputs = rng.integers((LONG_BLOCKS - 1) * 512 + 1, LONG_BLOCKS * 512, LONG_ROWS)
    pool = rng.integers(1, 2**64, LONG_BLOCKS * LONG_ROWS // 2, dtype=np.uint64)
    hashes = pool[rng.integers(0, len(pool), LONG_BLOCKS * LONG_ROWS)]
    path = tmp_path_factory.mktemp("long") / "long.rpt"
    return hashed_trace(path, hashes, LONG_BLOCKS, inputs, 512)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("fmt", HASH_EXPORTS)
def test_the_hashes_of_a_million_long_prompts_export_under_500_mb(
    long_prompt_trace: Path, tmp_path: Path, fmt: str
) -> None:
    """The hashes are kept in a mapped file and read a chunk at a time, shared ids are numbered in
    an array by the hash's place, reuse is counted a value range at a time. Holding the hashes
    and a sorted id table (as before) peaked here at 561 MB for mooncake, 566 csv, 694 parquet,
    1,372 profile (now 278, 407, 288, 280). The per-request columns of a million rows are the test above."""
    out = tmp_path / f"long.{fmt}"
    # ids of the recorded 512-token blocks (16-token ids would be 32 per hash: 770 M ids)
    stdout, peak = run_limited(
        "export", str(long_prompt_trace), "-f", fmt, "-o", str(out), "--block-size", "512"
    )
    assert f"wrote {LONG_ROWS} requests" in stdout
    assert peak < PEAK_MB, f"peak {peak} MB"
    if fmt not in ("parquet", "profile"):
        assert line_count(out) == LONG_ROWS + (fmt in ("csv", "azure"))


def test_every_export_format_has_a_scale_test() -> None:
    """A new exporter must join one of the memory tests of this module."""
    text_prompts = {
        "vllm-custom",
        "aiperf",
        "aiperf-dag",
    }  # test_text_prompt_exports_write_each_prompt_as_it_comes
    rows = {"mooncake", "bailian", "burstgpt", "jsonl"}  # test_million_row_export_stays_under_500_mb
    assert set(exporters()) == text_prompts | rows | set(HASH_EXPORTS)


def burstgpt_lines(path: Path, rows: int) -> Path:
    """BurstGPT rows with sessions, two models and failed requests, in arrival order."""
    header = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    with open(path, "w") as out:
        out.write(header)
        for lo in range(0, rows, 100_000):
            out.write(
                "".join(
                    f"{i // 4}.{i % 4 * 25},s{i % 7919},{i % 9 / 4},{'GPT-4' if i % 3 else 'ChatGPT'},"
                    f"{i % 900 + 1},{i % 13},0,API log\n"
                    for i in range(lo, min(rows, lo + 100_000))
                )
            )
    return path


IMPORT_ROWS = (250_000, 1_500_000)
GROWTH_MB = 15  # of the peak from the smaller file to the larger: 12 bytes a row at most
EXPORT_GROWTH_MB = 45  # 36 bytes a row at most


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_import_and_export_peaks_do_not_grow_with_rows(tmp_path: Path) -> None:
    """Imports: per-request columns go to temporary files as they are parsed and are written a
    frame at a time: six times the rows may not add more than a few bytes a row to the peak
    (holding the columns in memory, as imports once did, adds ~45 bytes a row: 60 MB here).
    Exports: numeric columns are mapped and read a chunk of requests at a time, failed requests
    left out the same way; what grows is the text columns' references (16 bytes a row here;
    holding the columns and whole-trace arrays in memory, as exports once did, added ~115)."""
    peaks, export_peaks = [], []
    for rows in IMPORT_ROWS:
        source = burstgpt_lines(tmp_path / f"{rows}.csv", rows)
        back = tmp_path / f"{rows}.rpt"
        stdout, peak = run_limited("import", str(source), "-f", "burstgpt", "-o", str(back))
        assert f"imported {rows} requests" in stdout
        peaks.append(peak)
        source.unlink()
        stdout, peak = run_limited("export", str(back), "-f", "burstgpt", "-o", str(source))
        assert "requests that failed at the source" in stdout  # the filtered path
        export_peaks.append(peak)
    assert peaks[1] - peaks[0] < GROWTH_MB, f"peaks {peaks} MB at {IMPORT_ROWS} rows"
    assert export_peaks[1] - export_peaks[0] < EXPORT_GROWTH_MB, f"export peaks {export_peaks} MB"
