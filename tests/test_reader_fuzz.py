"""Damaged trace and result files: thousands of mutations, each read under an address-space limit.

Bit flips, truncations, duplicated, swapped and dropped frames, huge declared lengths and counts,
and frames re-encoded with a valid checksum after their counts, kinds, lengths and values were
changed. Every read must end in workload statistics or a report (damage skipped and reported) or in the
project's own one-line error: no traceback, no MemoryError, no hang. The mutations run in one
subprocess (imports once) whose address space is limited to what it used before plus twice the
files' decompressed size plus 100 MB.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zstandard

from tests.fuzz_workers import run_workers

ROOT = Path(__file__).resolve().parents[1]
MUTATIONS = 2000  # per file kind
PER_READ_S = 5.0
_INDEX = struct.Struct("<IIII")


class Hang(Exception):
    """A read that took longer than PER_READ_S."""


def split_frames(data: bytes) -> list[tuple[bytes, bytes]]:
    """(index, zstd frame) pairs of an undamaged file."""
    frames, pos = [], 0
    while pos < len(data):
        _, _, length, _ = _INDEX.unpack_from(data, pos)
        frames.append((data[pos : pos + 16], data[pos + 16 : pos + 16 + length]))
        pos += 16 + length
    return frames


def join(frames: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(i + f for i, f in frames)


def frame_of(payload: bytes, records: int, declare_size: bool = True) -> tuple[bytes, bytes]:
    """A frame with a valid checksum and a matching index (re-checksummed after a change)."""
    params = zstandard.ZstdCompressionParameters.from_level(
        3, write_checksum=1, write_content_size=declare_size
    )
    compressed = zstandard.ZstdCompressor(compression_params=params).compress(payload)
    return _INDEX.pack(0x184D2A5E, 8, len(compressed), records), compressed


HUGE = [2**31 - 1, 2**32 - 1, 2**31, 2**40, 2**63 - 1, 2**64 - 1, -1, -(2**63)]


def odd_value(rng: random.Random) -> Any:
    return rng.choice(
        [None, True, 0, -1, rng.choice(HUGE), 1.5, float("nan"), "x", b"\xff" * rng.randint(0, 9),
         [1, 2], [[1]], {"a": 1}, {"n": [1]}, rng.randbytes(rng.randint(0, 40))]
    )  # fmt: skip


def mutate_record(record: Any, rng: random.Random) -> Any:
    """A structural change to one decoded record: counts, kinds, lengths, values, types."""
    if not isinstance(record, dict) or not record:
        return odd_value(rng)
    record = dict(record)
    kind = record.get("type")
    choice = rng.randrange(8)
    if kind == "batch" and choice < 5:
        columns = list(record.get("columns") or [])
        if choice == 0 or not columns:
            record["n"] = rng.choice([0, 1, record.get("n", 0) + 1, record.get("n", 0) * 1000, *HUGE, "n"])
        else:
            i = rng.randrange(len(columns))
            column = columns[i]
            if isinstance(column, list) and len(column) == 2 and choice >= 3:
                part = rng.randrange(2)
                if isinstance(column[part], bytes) and column[part]:  # lengths or codes, as u4
                    values = list(
                        struct.unpack(
                            f"<{len(column[part]) // 4}I", column[part][: len(column[part]) // 4 * 4]
                        )
                    )
                    if values:
                        values[rng.randrange(len(values))] = rng.choice([0, 1, 7, 2**31, 2**32 - 1])
                    column = [column[0], struct.pack(f"<{len(values)}I", *values)] if part else column
                    if part == 0:
                        column = [column[0][: rng.randrange(len(column[0]) + 1)], column[1]]
                elif isinstance(column[0], list):
                    column = [[odd_value(rng) for _ in column[0]], column[1]]
                else:
                    column = [odd_value(rng), column[1]]
            elif isinstance(column, bytes) and choice == 1:
                cut = rng.randrange(len(column) + 1)
                column = column[:cut] + rng.randbytes(rng.choice([0, 1, 8]))
            else:
                column = odd_value(rng)
            columns[i] = column
            record["columns"] = columns if rng.random() < 0.9 else columns[:-1]
        return record
    if kind == "header":
        fields = list(record.get("fields") or [])
        kinds = dict(record.get("kinds") or {})
        if choice == 0 and fields:
            kinds[rng.choice(fields)] = rng.choice(
                ["i8", "u8", "b1", "str", "obj", "ragged:u8", "ragged:u4", "?", 3]
            )
        elif choice == 1 and fields:
            fields.pop(rng.randrange(len(fields)))
        elif choice == 2 and fields:
            fields.append(rng.choice(fields))
        elif choice == 3:
            record["version"] = rng.choice([0, 2, "1", None, 2**70])
        elif choice == 4:
            record["fields"] = odd_value(rng)
            return record
        elif choice == 5:
            record["kinds"] = odd_value(rng)
            return record
        key = rng.choice(sorted(k for k in record if isinstance(k, str)))
        if choice >= 6:
            if rng.random() < 0.5:
                record.pop(key)
            else:
                record[key] = odd_value(rng)
            return record
        record["fields"], record["kinds"] = fields, kinds
        return record
    key = rng.choice(list(record))
    if rng.random() < 0.3:
        record[key] = odd_value(rng)
    elif isinstance(record[key], dict | list) and record[key]:
        inner = record[key]
        if isinstance(inner, list):
            inner = list(inner)
            inner[rng.randrange(len(inner))] = mutate_record(inner[0], rng)
        else:
            inner = mutate_record(inner, rng)
        record[key] = inner
    else:
        record["type"] = rng.choice(["batch", "header", "footer", "telemetry", "trace_profile", 5])
    return record


def rechecksummed(frames: list[tuple[bytes, bytes]], rng: random.Random) -> list[tuple[bytes, bytes]]:
    """One frame decoded, changed and encoded again with a valid checksum and index."""
    frames = list(frames)
    i = rng.randrange(len(frames))
    payload = zstandard.ZstdDecompressor().decompress(frames[i][1])
    records = list(msgpack.Unpacker(raw=False, strict_map_key=False).feed(payload) or [])
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(payload)
    records = list(unpacker)
    how = rng.randrange(4)
    if how == 0 or not records:  # raw msgpack bytes changed: declared lengths and counts inside
        raw = bytearray(payload)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(raw))
            if raw[at] in (0xC4, 0xC5, 0xC6, 0xDC, 0xDD, 0xDE, 0xDF) or rng.random() < 0.3:
                raw[at + 1 : at + 5] = rng.choice(
                    [b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", rng.randbytes(4)]
                )
            else:
                raw[at] = rng.randrange(256)
        new = bytes(raw)
    else:
        j = rng.randrange(len(records))
        records[j] = mutate_record(records[j], rng)
        try:
            new = b"".join(msgpack.packb(r, use_bin_type=True) for r in records)
        except (OverflowError, TypeError, ValueError):
            new = payload
    _, _, _, count = _INDEX.unpack(frames[i][0])
    if rng.random() < 0.3:
        count = rng.choice([0, count + 1, *[h for h in HUGE if 0 <= h < 2**32]])
    frames[i] = frame_of(new, count, declare_size=rng.random() < 0.8)
    return frames


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, bool]:
    """A damaged copy of `data`, and whether its frames may still decode to changed values (worth
    full statistics or a report, not just a read)."""
    how = rng.randrange(10)
    return _mutated(data, rng, how), how >= 7 or rng.random() < 0.2


def _mutated(data: bytes, rng: random.Random, how: int) -> bytes:
    frames = split_frames(data)
    if how == 0:  # bit flips
        raw = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return bytes(raw)
    if how == 1:  # random bytes
        raw = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.choice([0, 0xFF, rng.randrange(256)])
        return bytes(raw)
    if how == 2:
        return data[: rng.randrange(len(data))]
    if how == 3:  # duplicated frame
        i = rng.randrange(len(frames))
        frames.insert(rng.randrange(len(frames) + 1), frames[i])
        return join(frames)
    if how == 4 and len(frames) > 1:  # swapped frames
        i, j = rng.sample(range(len(frames)), 2)
        frames[i], frames[j] = frames[j], frames[i]
        return join(frames)
    if how == 5 and len(frames) > 1:  # a frame dropped
        frames.pop(rng.randrange(len(frames)))
        return join(frames)
    if how == 6:  # huge declared length or record count in an index
        i = rng.randrange(len(frames))
        magic, size, length, count = _INDEX.unpack(frames[i][0])
        value = rng.choice([h for h in HUGE if 0 <= h < 2**32] + [rng.randrange(2**32)])
        index = (
            _INDEX.pack(magic, size, value, count)
            if rng.random() < 0.5
            else _INDEX.pack(magic, size, length, value)
        )
        frames[i] = (index, frames[i][1])
        return join(frames)
    if how == 7:  # a zstd frame header declaring another content size
        i = rng.randrange(len(frames))
        payload = zstandard.ZstdDecompressor().decompress(frames[i][1])
        index, compressed = frame_of(payload, 1)
        raw = bytearray(compressed)
        fhd = raw[4]
        fcs_code = fhd >> 6
        start = 5 + (0 if fhd & 0x20 else 1) + (0, 1, 2, 4)[fhd & 3]
        width = (1 if fhd & 0x20 else 0, 2, 4, 8)[fcs_code]
        if width:
            raw[start : start + width] = rng.randbytes(width)
        frames[i] = (_INDEX.pack(0x184D2A5E, 8, len(raw), _INDEX.unpack(frames[i][0])[3]), bytes(raw))
        return join(frames)
    return join(rechecksummed(frames, rng))


def make_sources(directory: Path) -> dict[str, Path]:
    """A trace of several frames (all field kinds in use) and a result file with side records."""
    from replayproxy.clock import now_ns, wall_ns
    from replayproxy.results import ReplayResult, ResultWriter, RunHeader
    from replayproxy.shape import RequestShape
    from replayproxy.trace import TraceHeader, TraceWriter

    trace = directory / "t.rpt"
    header = TraceHeader(start_wall_ns=wall_ns(), block_size=16, block_unit="token")
    with TraceWriter(header, path=trace, mono_ns=now_ns, wall_ns=wall_ns, frame_records=12) as writer:
        writer.write_many([
            RequestShape(
                offset_ns=i * 10_000_000, model=f"m{i % 2}", input_tokens=100 + i, output_tokens=20 + i,
                max_tokens=64, sampling={"temperature": 0.5} if i % 3 else {}, roles="su" if i % 2 else "sua",
                prefix_hashes=tuple(range(i % 5)), prefix_units=100 + i, status=200, ttft_ns=5_000_000,
                e2e_ns=50_000_000, chunk_gaps_us=(100, 200)[: i % 3], session=i % 4, turn=i % 3,
            )
            for i in range(40)
        ])  # fmt: skip
    result = directory / "r.rpr"
    run = RunHeader(label="a", target="http://127.0.0.1:1", start_wall_ns=wall_ns(), options={"speed": 1.0})
    with ResultWriter(result, run, frame_records=12) as out:
        for i in range(40):
            out.write(ReplayResult(
                index=i, scheduled_ns=i * 1000, sent_ns=i * 1000 + 5, headers_ns=100, ttft_ns=200 + i,
                e2e_ns=5000 + i, chunk_gaps_us=(10, 20)[: i % 3], chunk_tokens=(1, 1)[: i % 3],
                content_chunks=1 + i % 3, status=200 if i % 7 else 500, error="" if i % 7 else "http_5xx",
                expected_input_tokens=100, expected_output_tokens=20, prompt_tokens=100, completion_tokens=20,
            ))  # fmt: skip
        out.write_extra("trace_profile", {"prefix_reuse": 0.5})
        out.write_extra("telemetry", {"source": "x", "samples": [{"t_ns": 1, "kv_usage": 0.5}], "found": {}})
    from replayproxy.results import CheckHeader, CheckRow, CheckTarget, CheckWriter

    check = directory / "c.rpc"
    targets = (CheckTarget("A", "http://127.0.0.1:1"), CheckTarget("B", "http://127.0.0.1:2"))
    writer = CheckWriter(
        check, CheckHeader(start_wall_ns=1, targets=targets, baseline="A", repeat=2, prompt_count=8)
    )
    for i in range(32):
        writer.write(CheckRow(
            "AB"[i % 2], i // 4, str(i // 4), i // 2 % 2, status=200 if i % 5 else 500,
            error="" if i % 5 else "http_5xx", output_hash=f"{i % 3:x}", similarity_ppm=i * 1000,
        ))  # fmt: skip
    writer.close()
    return {
        "trace": trace, "result": result, "check": check,
        "golden": ROOT / "tests" / "data" / "trace-v1-golden.rpt",
    }  # fmt: skip


def readers() -> dict[str, Callable[[Path, bool], object]]:
    from replayproxy.inspect_command import render_text as render_stats
    from replayproxy.report.document import build_document
    from replayproxy.report.render_text import render_text
    from replayproxy.report.runs import load_runs
    from replayproxy.results import load_checks
    from replayproxy.trace import load
    from replayproxy.workload_stats import workload_stats
    from tests.trace.helpers import shapes_in

    def trace(path: Path, consume: bool) -> object:
        columns = load([path])
        if consume:
            render_stats(workload_stats(columns))
            return len(shapes_in(columns))  # every value of every record, as a shape
        return columns

    def result(path: Path, consume: bool) -> object:
        runs = load_runs([path])
        return render_text(build_document(runs, resamples=100)) if consume else runs

    def check(path: Path, consume: bool) -> object:
        from replayproxy.report.checks.report import check_documents, render_checks

        return render_checks(check_documents([str(path)]), False, False) if consume else load_checks([path])

    return {"trace": trace, "golden": trace, "result": result, "check": check}


def _on_alarm(signum: int, frame: object) -> None:
    raise Hang()


def classify(e: BaseException) -> str | None:
    """None for the project's own error; otherwise what went wrong, in one line."""
    from replayproxy.trace import TraceFormatError

    if isinstance(e, TraceFormatError):
        return None
    where = traceback.extract_tb(e.__traceback__)[-1]
    if (
        isinstance(e, ValueError)
        and "/replayproxy/" in where.filename
        and "site-packages" not in where.filename
    ):
        return None  # raised on purpose by the project (e.g. a report refusing its input)
    return f"{type(e).__name__}: {str(e)[:80]} at {Path(where.filename).name}:{where.lineno}"


def worker(count: int, seed: int, kinds: list[str]) -> None:
    directory = Path(tempfile.mkdtemp(prefix="fuzz-"))
    sources = make_sources(directory)
    read = readers()
    originals = {name: path.read_bytes() for name, path in sources.items()}
    for name, path in sources.items():
        read[name](path, True)  # warm: imports, caches
    decompressed = sum(
        len(zstandard.ZstdDecompressor().decompress(f))
        for data in originals.values()
        for _, f in split_frames(data)
    )
    with open("/proc/self/status") as status:
        used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    limit = used + 2 * decompressed + (100 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _on_alarm)
    outcomes: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    rng = random.Random(seed)
    target = directory / "m"
    for name in kinds:
        n = count if name != "golden" else count // 10
        for _ in range(n):
            data, consume = mutate(originals[name], rng)
            path = target.with_suffix(sources[name].suffix)
            path.write_bytes(data)
            signal.setitimer(signal.ITIMER_REAL, PER_READ_S)
            try:
                read[name](path, consume)
                outcomes[f"{name}: read"] += 1
            except Hang:
                failures[f"{name}: hang"] += 1
            except MemoryError as e:
                where = traceback.extract_tb(e.__traceback__)[-2]
                failures[
                    f"{name}: MemoryError {str(e)[:50]} at {Path(where.filename).name}:{where.lineno}"
                ] += 1
            except Exception as e:  # noqa: BLE001 — every failure is what this test counts
                what = classify(e)
                if what is None:
                    outcomes[f"{name}: refused"] += 1
                else:
                    failures[f"{name}: {what}"] += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    print(json.dumps({"outcomes": outcomes, "failures": failures, "limit_mb": limit >> 20}))


@pytest.mark.timeout(300)
def test_damaged_files_never_crash_exhaust_memory_or_hang() -> None:
    jobs = [(1, "trace,golden"), (2, "result,check")]  # traces and results side by side, one core each
    summary = run_workers(__file__, MUTATIONS, jobs, timeout_s=280)
    assert not summary["failures"], json.dumps(summary, indent=1)
    outcomes = summary["outcomes"]
    for name in ("trace", "result", "check"):
        assert outcomes.get(f"{name}: read", 0) + outcomes.get(f"{name}: refused", 0) >= MUTATIONS
        assert outcomes.get(f"{name}: read", 0) > MUTATIONS // 10  # most damage is skipped, not refused


def _limited(megabytes: int) -> Callable[[], None]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (megabytes << 20, megabytes << 20))

    return limit


def test_a_huge_record_count_in_a_frame_index_is_not_believed(tmp_path: Path) -> None:
    """The first frame's record count (no checksum covers it) set to 2**31-1 drove `inspect` to 19 GB;
    under a 1 GiB address-space limit it must read the file as before."""
    data = bytearray((ROOT / "tests" / "data" / "trace-v1-golden.rpt").read_bytes())
    data[12:16] = struct.pack("<I", 0x7FFFFFFF)
    damaged = tmp_path / "damaged.rpt"
    damaged.write_bytes(bytes(data))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "replayproxy", "inspect", "--json", str(damaged)],
        capture_output=True, text=True, timeout=60, env=env, preexec_fn=_limited(1024),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["requests"] == 3
    assert "Traceback" not in done.stderr


def test_a_damaged_result_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    sources = make_sources(tmp_path)
    frames = split_frames(sources["result"].read_bytes())
    payload = zstandard.ZstdDecompressor().decompress(frames[0][1])
    header = msgpack.unpackb(payload, raw=False)
    del header["target"]  # a header that lost a required entry, with a valid checksum
    frames[0] = frame_of(msgpack.packb(header, use_bin_type=True), 0)
    damaged = tmp_path / "damaged.rpr"
    damaged.write_bytes(join(frames))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "replayproxy", "report", str(damaged)],
        capture_output=True, text=True, timeout=60, env=env, preexec_fn=_limited(1024),
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "header lacks 'target'" in done.stderr


def test_consistent_but_odd_headers_are_refused_or_read_never_a_crash(tmp_path: Path) -> None:
    """Files no mutation of a good one makes: a header without offset_ns whose batches agree with it,
    and start times so far apart that shifting offsets between files would overflow."""
    from replayproxy.clock import now_ns, wall_ns
    from replayproxy.shape import RequestShape
    from replayproxy.trace import TraceFormatError, TraceHeader, load, write_trace

    def write(name: str, header: TraceHeader) -> Path:
        shapes = [RequestShape(offset_ns=i, input_tokens=i) for i in range(3)]
        write_trace(tmp_path / name, header, shapes, mono_ns=now_ns, wall_ns=wall_ns)
        return tmp_path / name

    no_offsets = write("a.rpt", TraceHeader(start_wall_ns=0, fields=("input_tokens", "model")))
    try:
        load([no_offsets])
    except TraceFormatError as e:
        assert "lacks the required field 'offset_ns'" in str(e)
    else:
        raise AssertionError("a trace without arrival offsets was read")
    write("b.rpt", TraceHeader(start_wall_ns=0))
    assert len(load([tmp_path])) == 3  # a.rpt skipped and reported, b.rpt read
    far = tmp_path / "far"
    far.mkdir()
    header = msgpack.unpackb(
        zstandard.ZstdDecompressor().decompress(split_frames(no_offsets.read_bytes())[0][1])
    )
    assert header["type"] == "header"
    for i, start in enumerate((-(2**63), 2**63 - 1)):
        frames = split_frames(write(f"c{i}.rpt", TraceHeader(start_wall_ns=0)).read_bytes())
        record = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(frames[0][1]))
        record["start_wall_ns"] = start
        frames[0] = frame_of(msgpack.packb(record), 0)
        (far / f"c{i}.rpt").write_bytes(join(frames))
    try:
        load([far])
    except TraceFormatError as e:
        assert "start_wall_ns" in str(e)


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","))
