"""Import of a 1,000,000-line Mooncake file (budget: <= 10 s on one core), with side-by-side baselines.

CPU time is printed beside wall time because the machines are shared. The file is the public
Mooncake conversation trace (../shared/data/traces) repeated with shifted
timestamps and ids, or a synthetic file of the same shape when that trace is absent. Printed:
the import time (parse + hash chains + trace write), the time to merely orjson-parse every line
(the floor any JSON importer pays) and their ratio, then the export back to Mooncake. With
--formats, each export (and the import) also runs as `replayproxy` in a child process, printing
its time and peak RSS, and what it wrote is imported back (formats that import), at --lines and
at a quarter of it (time per row should stay flat); `--formats all` runs every export format
(the text-prompt ones on a fiftieth of the rows: their files are ~50 KB a request). The id
formats use --block-size 512 there (the source's blocks): 16-token ids of these 12k-token
prompts are 770 M ids per million rows.

    .venv/bin/python benchmarks/import_scale.py [--lines 1000000] [--formats all|mooncake,bailian,...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from replayproxy.formats import mooncake
from replayproxy.formats.exporting import ExportOptions
from replayproxy.formats.importing import ImportOptions, paused_gc, write_imported
from replayproxy.formats.registry import exporters
from replayproxy.trace import load

SOURCE = Path(__file__).resolve().parents[2] / "shared/data/traces/conversation_trace.jsonl"


def make_file(path: Path, lines: int) -> None:
    """`lines` Mooncake rows: copies of the public trace, each later in time with its own ids."""
    if SOURCE.exists():
        rows = [orjson.loads(line) for line in SOURCE.read_bytes().splitlines() if line.strip()]
    else:
        rng = np.random.default_rng(0)
        rows = [
            {
                "timestamp": i * 300,
                "input_length": int(n),
                "output_length": 300,
                "hash_ids": [0, *range(1 + 30 * i, 1 + 30 * i + (int(n) - 1) // 512)],
            }
            for i, n in enumerate(rng.integers(600, 15000, 12000))
        ]
    span = rows[-1]["timestamp"] + 1000
    id_span = max(max(r["hash_ids"], default=0) for r in rows) + 1
    with open(path, "wb") as out:
        written, copy = 0, 0
        while written < lines:
            for row in rows[: lines - written]:
                shifted = {
                    **row,
                    "timestamp": row["timestamp"] + copy * span,
                    "hash_ids": [h + copy * id_span for h in row["hash_ids"]],
                }
                out.write(orjson.dumps(shifted) + b"\n")
            written += min(len(rows), lines - (written))
            copy += 1


CHILD = (
    "import sys\n"
    "from replayproxy import cli\n"
    "code = cli.main(sys.argv[1:])\n"
    "status = open('/proc/self/status').read()\n"  # VmHWM: this process's own peak (ru_maxrss is inherited)
    "print('peak_mb', int(status.split('VmHWM:')[1].split()[0]) // 1024)\n"
    "sys.exit(code)\n"
)


def timed_cli(*args: str) -> tuple[float, int]:
    """Seconds and peak RSS (MB) of one `replayproxy` command in a fresh process."""
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"{' '.join(args)} failed: {run.stderr.strip()[-500:]}")
    return time.perf_counter() - start, int(run.stdout.split("peak_mb")[-1])


IMPORTABLE = {"mooncake", "bailian", "azure", "burstgpt", "jsonl"}
ID_FORMATS = ("mooncake", "bailian", "jsonl")
# Prompt text of these 12k-token requests is ~50 KB a row (60 GB per million): they run on a
# fiftieth of the rows, which shows whether memory and time per row stay flat.
TEXT_FORMATS = {"vllm-custom", "aiperf"}
TEXT_SHARE = 50


def scale_table(lines: int, formats: list[str], block: int) -> None:
    """Each export, and the import of what it wrote, as the CLI runs them, at `lines` and
    `lines // 4` (time per row should stay flat, peak memory bounded)."""
    print(f"hash-id formats at --block-size {block} (the same ids in every format, so rows compare)")
    print(f"{'step':<18} {'rows':>9} {'time s':>8} {'us/row':>7} {'peak MB':>8} {'file MB':>8}")

    def line(step: str, rows: int, seconds: float, peak: int, path: Path) -> None:
        size = path.stat().st_size / 1e6
        print(f"{step:<18} {rows:>9,} {seconds:>8.2f} {seconds / rows * 1e6:>7.2f} {peak:>8} {size:>8.1f}")

    for rows in (lines // 4, lines):
        with tempfile.TemporaryDirectory() as tmp:
            source, trace = Path(tmp) / "big.jsonl", Path(tmp) / "big.rpt"
            make_file(source, rows)
            seconds, peak = timed_cli("import", str(source), "-f", "mooncake", "-o", str(trace))
            line("import mooncake", rows, seconds, peak, source)
            if TEXT_FORMATS & set(formats):
                few = max(rows // TEXT_SHARE, 1)
                make_file(source, few)
                timed_cli("import", str(source), "-f", "mooncake", "-o", str(Path(tmp) / "few.rpt"))
            source.unlink()
            for fmt in formats:
                out, back = Path(tmp) / f"out.{fmt}", Path(tmp) / "back.rpt"
                text = fmt in TEXT_FORMATS
                exported = Path(tmp) / "few.rpt" if text else trace
                blocks = ["--block-size", str(block)] if fmt in ID_FORMATS else []
                seconds, peak = timed_cli("export", str(exported), "-f", fmt, "-o", str(out), *blocks)
                line(f"export {fmt}", few if text else rows, seconds, peak, out)
                if fmt in IMPORTABLE:
                    seconds, peak = timed_cli("import", str(out), "-f", fmt, "-o", str(back), *blocks)
                    line(f"import {fmt}", rows, seconds, peak, out)
                    back.unlink()
                out.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument(
        "--formats",
        help="comma-separated formats, or all: export, then import back, as the CLI runs them (peak memory)",
    )
    parser.add_argument("--block-size", type=int, default=512, help="tokens per id in id formats (--formats)")
    args = parser.parse_args()
    if args.formats:
        formats = list(exporters()) if args.formats == "all" else args.formats.split(",")
        scale_table(args.lines, formats, args.block_size)
        return
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as the budget says
    with tempfile.TemporaryDirectory() as tmp:
        source, trace, back = Path(tmp) / "big.jsonl", Path(tmp) / "big.rpt", Path(tmp) / "back.jsonl"
        make_file(source, args.lines)
        size_mb = source.stat().st_size / 1e6

        start = time.perf_counter()
        for line in source.read_bytes().split(b"\n"):
            if line:
                orjson.loads(line)
        parse_s = time.perf_counter() - start

        start, cpu = time.perf_counter(), time.process_time()
        with paused_gc():  # as `replayproxy import` does
            imported = mooncake.read(source, ImportOptions())
            read_s, read_cpu_s = time.perf_counter() - start, time.process_time() - cpu
            write_imported(imported, trace, lambda: 0)
        import_s, import_cpu_s = time.perf_counter() - start, time.process_time() - cpu

        start = time.perf_counter()
        cols = load(trace)
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        mooncake.write(cols, back, ExportOptions())
        export_s = time.perf_counter() - start

    blocks = int(imported.hashes.counts().sum()) if imported.hashes is not None else 0
    print(f"file: {args.lines:,} lines, {size_mb:.0f} MB, {blocks:,} full-block hashes")
    print(f"orjson parse only      {parse_s:6.2f} s")
    print(
        f"import (read+write)    {import_s:6.2f} s   ratio to parse-only {import_s / parse_s:4.2f}x   "
        f"(read {read_s:.2f} s, write {import_s - read_s:.2f} s; CPU {import_cpu_s:.2f} s: read "
        f"{read_cpu_s:.2f}, write {import_cpu_s - read_cpu_s:.2f})   "
        f"budget 10 s: {'OK' if min(import_s, import_cpu_s) <= 10 else 'OVER'}"
    )
    print(f"load trace             {load_s:6.2f} s")
    print(f"export mooncake        {export_s:6.2f} s   ratio to parse-only {export_s / parse_s:4.2f}x")


if __name__ == "__main__":
    main()
