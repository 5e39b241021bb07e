"""Workload statistics (replayproxy/workload_stats.py) against numbers computed in plain Python."""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from replayproxy import trace
from replayproxy.cli import main
from replayproxy.shape import RequestShape
from replayproxy.trace import TraceHeader
from replayproxy.workload_stats import hit_blocks, workload_stats

START_NS = 1_700_000_000 * 10**9


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (the usual definition, numpy's default)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def hand_made(rng: random.Random, n: int = 300) -> list[RequestShape]:
    """Requests with shared prefixes from a few groups, sessions, errors and recorded timings."""
    groups = [[rng.getrandbits(64) for _ in range(rng.randint(1, 6))] for _ in range(4)]
    shapes, t = [], 0
    for i in range(n):
        t += int(rng.expovariate(1 / 0.05) * 1e9) if i % 17 else 0  # some arrivals coincide
        hashes = [*rng.choice(groups), *(rng.getrandbits(64) for _ in range(rng.randint(0, 5)))]
        known = rng.random() > 0.1
        shapes.append(
            RequestShape(
                offset_ns=t,
                endpoint=rng.choice(["chat", "chat", "completions"]),
                model=rng.choice(["a", "b", "c"]),
                stream=rng.random() < 0.7,
                input_tokens=len(hashes) * 16 + rng.randint(0, 15) if known else -1,
                output_tokens=rng.randint(1, 500) if known else -1,
                prefix_hashes=tuple(hashes),
                prefix_units=len(hashes) * 16,
                error=rng.choice(["", "", "", "http_5xx", "timeout"]),
                ttft_ns=rng.randint(1, 10**9) if rng.random() < 0.8 else -1,
                e2e_ns=rng.randint(10**8, 3 * 10**9) if rng.random() < 0.8 else -1,
                session=rng.choice([0, 0, 11, 12, 13]),
            )
        )
    return shapes


def write(path: Path, shapes: list[RequestShape], start_ns: int = START_NS, **header: object) -> Path:
    trace.write_trace(
        path,
        TraceHeader(start_wall_ns=start_ns, **header),
        shapes,
        mono_ns=lambda: 0,
        wall_ns=lambda: 0,  # type: ignore[arg-type]
    )
    return path


def expected_reuse(shapes: list[RequestShape], block_size: int = 16) -> float:
    seen: set[int] = set()
    hit = total = 0
    for shape in shapes:
        if shape.input_tokens > 0:
            hit += min(sum(block_size for h in shape.prefix_hashes if h in seen), shape.input_tokens)
            total += shape.input_tokens
        seen.update(shape.prefix_hashes)
    return hit / total


def expected_peak_concurrency(shapes: list[RequestShape]) -> int:
    spans = [(s.offset_ns, s.offset_ns + s.e2e_ns) for s in shapes if s.e2e_ns >= 0]
    return max(sum(1 for start, end in spans if start <= t < end) for t, _ in spans)


def test_stats_match_an_independent_computation(tmp_path: Path) -> None:
    shapes = hand_made(random.Random(7))
    # Two files, one starting 3 s later, written out of arrival order: the statistics see one timeline.
    late = [s for i, s in enumerate(shapes) if i % 3 == 0]
    early = [s for i, s in enumerate(shapes) if i % 3 != 0]
    write(tmp_path / "a.rpt", list(reversed(early)))
    shifted = [RequestShape(**{**_fields(s), "offset_ns": s.offset_ns - 3 * 10**9}) for s in late]
    write(tmp_path / "b.rpt", shifted, START_NS + 3 * 10**9)
    stats = workload_stats(trace.load(tmp_path))

    offsets = sorted(s.offset_ns for s in shapes)
    duration_s = (offsets[-1] - offsets[0]) / 1e9
    gaps = [(b - a) / 1e9 for a, b in zip(offsets, offsets[1:], strict=False)]
    windows = Counter((t - offsets[0]) // 10**9 for t in offsets)
    assert stats["requests"] == len(shapes) and stats["files"] == 2
    assert stats["duration_s"] == pytest.approx(duration_s)
    assert stats["rate_mean_rps"] == pytest.approx((len(shapes) - 1) / duration_s)
    assert stats["rate_peak_rps"] == max(windows.values())
    assert stats["interarrival_cv"] == pytest.approx(statistics.pstdev(gaps) / statistics.mean(gaps))
    for name in ("input_tokens", "output_tokens"):
        known = [getattr(s, name) for s in shapes if getattr(s, name) >= 0]
        assert stats[name]["count"] == len(known)
        for q in (50, 90, 99):
            assert stats[name][f"p{q}"] == pytest.approx(percentile(known, q))
        assert stats[name]["max"] == max(known) and stats[name]["mean"] == pytest.approx(
            statistics.mean(known)
        )
    ttfts = [s.ttft_ns / 1e6 for s in shapes if s.ttft_ns >= 0]
    assert stats["ttft_ms"]["p99"] == pytest.approx(percentile(ttfts, 99))
    assert stats["e2e_ms"]["count"] == sum(1 for s in shapes if s.e2e_ns >= 0)
    assert stats["stream_share"] == pytest.approx(sum(s.stream for s in shapes) / len(shapes))
    assert stats["endpoints"] == dict(Counter(s.endpoint for s in shapes))
    assert stats["models"] == dict(Counter(s.model for s in shapes))
    assert stats["errors"] == dict(Counter(s.error for s in shapes if s.error))
    assert stats["sessions"] == 3
    in_order = sorted(shapes, key=lambda s: s.offset_ns)  # stable: equal times keep their order
    assert stats["prefix_reuse"] == pytest.approx(expected_reuse(in_order))
    assert stats["peak_concurrency"] == expected_peak_concurrency(shapes)


def _fields(shape: RequestShape) -> dict[str, object]:
    return {name: getattr(shape, name) for name in shape._fields}


def test_counts_are_ranked_most_frequent_first(tmp_path: Path) -> None:
    shapes = [RequestShape(offset_ns=i, model=m) for i, m in enumerate("abbcccb")]
    assert list(workload_stats(trace.load(write(tmp_path / "t.rpt", shapes)))["models"].items()) == [
        ("b", 3), ("c", 3), ("a", 1),
    ]  # fmt: skip


def test_char_blocks_count_tokens_by_each_requests_ratio(tmp_path: Path) -> None:
    # 64 chars per block; request 2 repeats request 1's two blocks, and has 4 chars per token.
    shapes = [
        RequestShape(offset_ns=0, input_tokens=50, prefix_hashes=(1, 2), prefix_units=200),
        RequestShape(offset_ns=1, input_tokens=100, prefix_hashes=(1, 2, 3), prefix_units=400),
    ]
    stats = workload_stats(trace.load(write(tmp_path / "t.rpt", shapes, block_size=64, block_unit="char")))
    assert stats["prefix_reuse"] == pytest.approx((2 * 64 * 100 / 400) / 150)


def test_unknown_timings_and_missing_hashes_give_nulls(tmp_path: Path) -> None:
    shapes = [RequestShape(offset_ns=0), RequestShape(offset_ns=10**9, output_tokens=3)]
    stats = workload_stats(trace.load(write(tmp_path / "t.rpt", shapes)))
    assert stats["prefix_reuse"] is None and stats["peak_concurrency"] is None
    assert stats["ttft_ms"] == {
        "count": 0,
        "p50": None,
        "p90": None,
        "p99": None,
        "max": None,
        "mean": None,
    }
    assert stats["input_tokens"]["count"] == 0 and stats["output_tokens"]["p50"] == 3
    assert stats["errors"] == {} and stats["sessions"] == 0


def test_traces_hashed_with_different_keys_are_not_compared(tmp_path: Path) -> None:
    write(
        tmp_path / "a.rpt",
        [RequestShape(offset_ns=0, input_tokens=16, prefix_hashes=(5,))],
        key_fingerprint="aa",
    )
    write(
        tmp_path / "b.rpt",
        [RequestShape(offset_ns=1, input_tokens=16, prefix_hashes=(5,))],
        key_fingerprint="bb",
    )
    assert workload_stats(trace.load(tmp_path))["prefix_reuse"] is None
    assert workload_stats(trace.load(tmp_path / "a.rpt"))["prefix_reuse"] == 0.0


def test_empty_and_single_request_traces(tmp_path: Path) -> None:
    empty = workload_stats(trace.load(write(tmp_path / "e.rpt", [])))
    assert empty["requests"] == 0 and empty["rate_mean_rps"] is None and empty["rate_peak_rps"] is None
    assert empty["stream_share"] is None and empty["interarrival_cv"] is None
    one = workload_stats(trace.load(write(tmp_path / "o.rpt", [RequestShape(offset_ns=5, e2e_ns=7)])))
    assert one["requests"] == 1 and one["duration_s"] == 0 and one["rate_peak_rps"] == 1.0
    assert one["peak_concurrency"] == 1


@pytest.mark.parametrize("chunk", [1, 3, 1 << 22])
def test_hit_blocks_survive_hashes_that_agree_on_their_top_or_bottom_bits(chunk: int) -> None:
    rng = random.Random(3)
    pool = [rng.getrandbits(64) for _ in range(40)]
    rows = [rng.sample(pool, rng.randint(0, 9)) for _ in range(8)]  # chained hashes never repeat in a row
    # With 8 rows the row takes 3 bits, so the hash is compared on 61 of its 64 bits, twice.
    rows[2], rows[3] = [pool[0]], [pool[1]]
    rows[4] = [pool[0] ^ 0b101, *rows[4]]  # differs from pool[0] only in its bottom 3 bits
    rows[6] = [pool[1] ^ (0b011 << 61), *rows[6]]  # differs from pool[1] only in its top 3 bits
    seen: set[int] = set()
    expected = []
    for hashes in rows:
        expected.append(sum(h in seen for h in hashes))
        seen.update(hashes)
    flat = np.array([h for hashes in rows for h in hashes], dtype=np.uint64)
    index = np.concatenate([[0], np.cumsum([len(hashes) for hashes in rows])])
    assert hit_blocks(flat, index, chunk).tolist() == expected


def test_a_directory_with_empty_and_unreadable_files_reads_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a full disk used to leave behind (0-byte files) hid every readable record of the directory."""
    rng = random.Random(3)
    write(tmp_path / "a.rpt", hand_made(rng, 40))
    (tmp_path / "b.rpt").write_bytes(b"")
    (tmp_path / "c.rpt").write_bytes(b"not a trace at all")
    write(tmp_path / "d.rpt", hand_made(rng, 7))
    assert main(["inspect", "--json", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["requests"] == 47
    assert "b.rpt: skipped: empty file" in err and "c.rpt: skipped: not a replayproxy file" in err
    (tmp_path / "a.rpt").unlink()
    (tmp_path / "d.rpt").unlink()
    assert main(["inspect", str(tmp_path)]) == 2  # nothing readable: one line, exit 2
    assert capsys.readouterr().err.strip().count("\n") == 0
