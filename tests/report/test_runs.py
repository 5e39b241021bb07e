"""Loading runs: labels, shard merging, sweep-step naming."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from replayproxy.report.runs import load_runs, read_runs
from replayproxy.results import ResultWriter, RunHeader
from replayproxy.trace.column_file import ColumnFileWriter
from tests.report.helpers import result, write_run

SEC = 10**9


def test_label_defaults_to_target_and_model(tmp_path: Path) -> None:
    models = {"object": "list", "data": [{"id": "llama"}]}
    a = write_run(tmp_path / "a.rpr", [result(0)], target="http://x:8000", models=models)
    b = write_run(tmp_path / "b.rpr", [result(0)], target="http://y", options={"model": "qwen"})
    c = write_run(tmp_path / "c.rpr", [result(0)], label="candidate")
    assert [r.label for r in load_runs([a, b, c])] == ["http://x:8000 llama", "http://y qwen", "candidate"]


def test_equal_labels_are_kept_and_headings_name_the_speed_or_the_repetition(tmp_path: Path) -> None:
    paths = [
        write_run(tmp_path / f"s{i}.rpr", [result(0)], options={"speed": s}) for i, s in enumerate((1, 2.5))
    ]
    paths += [write_run(tmp_path / f"t{i}.rpr", [result(0)], target="http://b") for i in range(2)]
    runs = load_runs(paths)
    assert [r.label for r in runs] == ["http://a", "http://a", "http://b", "http://b"]
    assert [r.name for r in runs] == [
        "http://a at 1x",
        "http://a at 2.5x",
        "http://b (run 1/2)",
        "http://b (run 2/2)",
    ]
    assert [(r.repetition, r.repetitions) for r in runs] == [(1, 1), (1, 1), (1, 2), (2, 2)]


def test_shards_merge_into_one_run_on_one_time_line(tmp_path: Path) -> None:
    start = 1_700_000_000 * SEC
    s1 = write_run(
        tmp_path / "r1.rpr",
        [result(0, sent_ms=0), result(2, sent_ms=200)],
        label="L",
        shard="1/2",
        start_wall_ns=start,
    )
    s2 = write_run(
        tmp_path / "r2.rpr", [result(1, sent_ms=0)], label="L", shard="2/2", start_wall_ns=start + SEC
    )
    other = write_run(tmp_path / "x.rpr", [result(0)], label="M")
    runs = load_runs([s1, s2, other])
    assert [r.label for r in runs] == ["L", "M"]
    merged = runs[0]
    assert merged.shards == 2 and merged.measures.n == 3
    assert sorted(merged.measures.requests.index) == [0, 1, 2]
    assert sorted(merged.measures.start_s) == pytest.approx([0.0, 0.2, 1.0])  # shard 2 started 1 s later


def test_two_copies_of_one_shard_are_refused(tmp_path: Path) -> None:
    s1 = write_run(tmp_path / "r1.rpr", [result(0)], label="L", shard="1/2")
    s2 = write_run(tmp_path / "r2.rpr", [result(1)], label="L", shard="1/2")
    with pytest.raises(ValueError, match="both shard 1/2"):
        load_runs([s1, s2])


def test_a_truncated_file_keeps_what_was_read_and_names_its_damage(tmp_path: Path) -> None:
    whole = write_run(tmp_path / "whole.rpr", [result(i) for i in range(3000)], label="L")
    data = whole.read_bytes()
    cut = tmp_path / "cut.rpr"
    cut.write_bytes(data[: len(data) * 3 // 4])  # a crash while writing: the tail and footer are gone
    whole.unlink()
    loaded = read_runs([cut])
    (run,) = loaded.runs
    assert 0 < run.measures.n < 3000  # every complete frame before the cut loaded
    assert run.damage and "truncated" in run.damage[0]
    (line,) = loaded.damaged
    assert line.startswith(f"{cut}: read in part (") and line.endswith(f"{run.measures.n} requests read")
    assert loaded.duplicates == []


def test_a_file_without_its_footer_is_read_in_part(tmp_path: Path) -> None:
    # Every frame reads, but the writer never wrote its footer (a failed write abandons the file).
    path = write_run(tmp_path / "r.rpr", [result(0)], label="L")
    header = RunHeader(label="L", target="http://a", start_wall_ns=1)
    writer = ColumnFileWriter(tmp_path / "open.rpr", header.to_record(), level=3, exclusive=False)
    for i in range(3):
        writer.add(result(i).to_record())
    writer.flush()
    writer.abandon()
    loaded = read_runs([path, tmp_path / "open.rpr"])
    no_footer = "no footer: the file ends early (its writer did not finish)"
    assert [r.damage for r in loaded.runs] == [(), (no_footer,)]
    assert loaded.runs[1].measures.n == 3


def test_an_unreadable_file_among_several_is_named(tmp_path: Path) -> None:
    good = write_run(tmp_path / "a.rpr", [result(0)], label="L")
    (tmp_path / "b.rpr").write_bytes(good.read_bytes()[:100])
    loaded = read_runs([tmp_path])
    assert len(loaded.runs) == 1
    (line,) = loaded.damaged
    assert line.startswith(f"{tmp_path / 'b.rpr'}: skipped: ")


def test_a_copied_run_is_counted_once(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a.rpr", [result(i, ttft_ms=10 + i) for i in range(5)], label="L")
    b = write_run(tmp_path / "b.rpr", [result(i, ttft_ms=10 + i) for i in range(5)], label="L")
    shutil.copy(a, tmp_path / "c.rpr")  # byte for byte
    loaded = read_runs([tmp_path])
    # b has equal contents but a start of its own: another repetition, not a copy
    assert [r.paths for r in loaded.runs] == [(str(a),), (str(b),)]
    assert [r.name for r in loaded.runs] == ["L (run 1/2)", "L (run 2/2)"]
    assert loaded.duplicates == [f"{tmp_path / 'c.rpr'} is a copy of {a} (the same run): counted once"]


def test_a_rewritten_copy_of_a_run_is_counted_once(tmp_path: Path) -> None:
    # The same run written again in other frames (e.g. exported and re-imported): other bytes, one run.
    rows = [result(i, ttft_ms=10 + i) for i in range(5)]
    a = write_run(tmp_path / "a.rpr", rows, label="L", start_wall_ns=7)
    header = RunHeader(label="L", target="http://a", start_wall_ns=7, trace_digest="d1")
    with ResultWriter(tmp_path / "b.rpr", header, frame_records=2) as writer:
        for r in rows:
            writer.write(r)
    assert a.read_bytes() != (tmp_path / "b.rpr").read_bytes()
    loaded = read_runs([tmp_path])
    assert len(loaded.runs) == 1 and len(loaded.duplicates) == 1
