"""Loading runs: labels, shard merging, sweep-step naming."""

from __future__ import annotations

from pathlib import Path

import pytest

from replayproxy.report.runs import load_runs
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
