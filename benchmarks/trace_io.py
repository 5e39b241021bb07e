"""Trace I/O against the obvious alternative, zstd-compressed JSON lines, measured side by side.

    .venv/bin/python benchmarks/trace_io.py [--requests 1000000]

Builds the requests with `synthetic.generate` (chat, shared system prompts, multi-turn sessions),
then times, on one core and in one run: writing them with `TraceWriter`, loading them into numpy
columns with `trace.load`, and the same records as orjson lines in one zstd level-3 stream (load =
decompress + orjson.loads per line + numpy columns). The file is written in bulk, so frames are cut
every 16384 records (a live recorder also cuts one per flush interval, i.e. smaller frames at low
rates, which compress less). Budgets (the trace format's): write >= 300k records/s,
load >= 1M records/s, file <= 0.6x the bytes of the JSONL. Ratios are the figures to trust on a
shared machine; absolute rates move with the load of the moment.

On a VM the first touch of a page of guest memory is paid to the hypervisor (here 2-4 us per 4 KiB,
more than decompressing into it), and a load builds ~1 KB of new arrays per request. So the load is
timed twice: as it comes, and again right after touching and freeing as many bytes as it fills,
which the kernel then hands back to it already backed, the state of memory on a machine in use.
"""

from __future__ import annotations

import argparse
import gc
import io
import itertools
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import zstandard

from replayproxy.clock import now_ns
from replayproxy.shape import FIELD_KINDS, FIELDS, RequestShape
from replayproxy.synthetic import LengthDist, SynthSpec, generate, header_for
from replayproxy.trace import Columns, TraceWriter, load
from replayproxy.trace.writer import WRITE_SLICE

WORKLOAD = dict(
    rate_rps=100.0, arrival_cv=2.0, prefix_groups=16, prefix_len_tokens=512, sessions_share=0.3,
    input_len=LengthDist("lognormal", mean=1000, sigma=0.8),
    output_len=LengthDist("lognormal", mean=250, sigma=0.8),
    model="llama-3.1-8b-instruct", seed=1,
)  # fmt: skip
WORKLOAD_TEXT = "chat, 16 system prompts of 512 tokens, prompts ~1000 tokens, 30% in sessions, gamma CV 2"


class Stopwatch:
    """Adds up the CPU time spent inside `with watch:` blocks.

    CPU time, not wall time: this machine is shared, and the budgets are per core. Everything
    measured runs on this one thread (zstd included), so CPU seconds are the cost.
    """

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> None:
        self._start = time.process_time_ns()

    def __exit__(self, *exc: object) -> None:
        self.seconds += (time.process_time_ns() - self._start) / 1e9


def as_json(shape: RequestShape) -> dict[str, object]:
    return {name: getattr(shape, name) for name in FIELDS}


def write_both(spec: SynthSpec, rpt: Path, jsonl: Path) -> tuple[int, float, float, float]:
    """Generate in small chunks and time each writer on the same chunk.

    A million shapes do not fit in memory, and a recorder's writer thread never holds more than
    its queue: holding them all would make the garbage collector's passes, not writing, the cost.
    Chunks are as big as the slices `write_trace` hands over (512) and the collector runs before
    a chunk is made, not between making and writing it: writers get shapes just built (synth and
    importers a slice at a time, a recorder its queue every 20 ms), still in the CPU caches.
    """
    rpt_watch, json_watch = Stopwatch(), Stopwatch()
    shapes = generate(spec)
    n = hashes = 0
    with (
        TraceWriter(
            header_for(spec), path=rpt, mono_ns=now_ns, wall_ns=lambda: 0, flush_interval_s=1e9
        ) as writer,
        open(jsonl, "wb") as raw,
        zstandard.ZstdCompressor(level=3).stream_writer(raw) as out,
    ):
        while True:
            gc.collect()
            chunk = list(itertools.islice(shapes, WRITE_SLICE))
            if not chunk:
                break
            n += len(chunk)
            hashes += sum(len(s.prefix_hashes) for s in chunk)
            with rpt_watch:
                writer.write_many(chunk)
            with json_watch:
                for shape in chunk:
                    out.write(orjson.dumps(as_json(shape), default=list) + b"\n")
        with rpt_watch:
            writer.close()
    return n, hashes / max(n, 1), rpt_watch.seconds, json_watch.seconds


def load_jsonl(path: Path) -> dict[str, np.ndarray]:
    """The fair equivalent of trace.load: every field as a column, ragged ones flat + index."""
    parts: dict[str, list[np.ndarray]] = {}
    with open(path, "rb") as raw:
        lines = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw), 1 << 20)
        while chunk := list(itertools.islice(lines, 65_536)):
            records = [orjson.loads(line) for line in chunk]
            for name, kind in FIELD_KINDS.items():
                values = [r[name] for r in records]
                if kind.startswith("ragged"):
                    parts.setdefault(name + "_lengths", []).append(np.fromiter(map(len, values), np.int64))
                    flat = itertools.chain.from_iterable(values)
                    parts.setdefault(name, []).append(
                        np.fromiter(flat, "u8" if kind == "ragged:u8" else "u4")
                    )
                else:
                    dtype = {"i8": np.int64, "u8": np.uint64, "b1": np.bool_}.get(kind, object)
                    parts.setdefault(name, []).append(np.array(values, dtype=dtype))
    return {name: np.concatenate(arrays) for name, arrays in parts.items()}


def _ragged_arrays(columns: Columns) -> tuple[np.ndarray, ...]:
    return columns.prefix_hashes, columns.prefix_index, columns.chunk_gaps_us, columns.chunk_index


def timed_load(fn, path):  # type: ignore[no-untyped-def]
    gc.collect()
    watch = Stopwatch()
    with watch:
        result = fn(path)
    return result, watch.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    args = parser.parse_args()
    spec = SynthSpec(requests=args.requests, **WORKLOAD)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as tmp:
        rpt, jsonl = Path(tmp) / "t.rpt", Path(tmp) / "t.jsonl.zst"
        n, hashes, rpt_write_s, json_write_s = write_both(spec, rpt, jsonl)
        print(f"{n} requests ({WORKLOAD_TEXT}); {hashes:.1f} prefix hashes per request")
        json_columns, json_load_s = timed_load(load_jsonl, jsonl)
        columns, rpt_load_s = timed_load(load, rpt)
        assert len(columns) == n and np.array_equal(columns.input_tokens, json_columns["input_tokens"])
        assert np.array_equal(columns.prefix_hashes, json_columns["prefix_hashes"])
        rpt_bytes, json_bytes = os.path.getsize(rpt), os.path.getsize(jsonl)
        loaded_bytes = sum(a.nbytes for a in (*columns.scalar.values(), *_ragged_arrays(columns)))
        _, touch_s = timed_load(lambda size: np.ones(size, np.uint8).nbytes, loaded_bytes)
        del columns
        _, touched_load_s = timed_load(load, rpt)  # into the pages just touched and freed
    rows = [
        ("write, records/CPU-s", n / rpt_write_s, n / json_write_s, ">= 300k"),
        ("load into numpy, records/CPU-s", n / rpt_load_s, n / json_load_s, ">= 1M"),
        ("bytes per request", rpt_bytes / n, json_bytes / n, "<= 0.6x"),
    ]
    print(
        f"the load fills {loaded_bytes / 1e9:.2f} GB of new arrays ({rpt_load_s:.2f} CPU-s in all);"
        f" filling that much fresh memory, and nothing else, took {touch_s:.2f} CPU-s here"
    )
    print(f"{'':28} {'.rpt':>12} {'jsonl+zstd':>12} {'ratio':>7}  budget")
    for name, ours, theirs, budget in rows:
        print(f"{name:28} {ours:12,.0f} {theirs:12,.0f} {ours / theirs:7.2f}  {budget}")
    print(f"{'load, memory touched before':28} {n / touched_load_s:12,.0f} {'':>12} {'':>7}  >= 1M")


if __name__ == "__main__":
    main()
