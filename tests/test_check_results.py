"""Check files (.rpc): round trip of every field, the header's contract, and which fields may hold text."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayproxy.results import (
    CHECK_FIELDS,
    CheckHeader,
    CheckRow,
    CheckTarget,
    CheckWriter,
    load_checks,
    load_results,
)
from replayproxy.trace import TraceFormatError
from tests.cli import run_cli

I64 = st.integers(-(2**63), 2**63 - 1)
rows = st.builds(
    CheckRow,
    target=st.sampled_from(["A", "B"]),
    prompt_index=st.integers(0, 1),  # within the header's prompt_count and repeat (the reader checks)
    prompt_id=st.text(max_size=8),
    repeat=st.integers(0, 2),
    endpoint=st.sampled_from(["chat", "completion"]),
    messages=I64,
    has_stop=st.booleans(),
    structure=st.sampled_from(["", "json_object", "json_schema", "tools"]),
    has_reference=st.booleans(),
    status=I64,
    error=st.sampled_from(["", "timeout"]),
    prompt_tokens=I64,
    completion_tokens=I64,
    finish_reason=st.sampled_from(["stop", "length", ""]),
    output_hash=st.text("0123456789abcdef", max_size=16),
    json_valid=st.sampled_from([-1, 0, 1]),
    similarity_ppm=st.integers(-1, 10**6),
    reference_similarity_ppm=st.integers(-1, 10**6),
    score=st.sampled_from(["", "0", "0.5", "-3"]),
    output=st.text(max_size=10),
)
HEADER = CheckHeader(
    start_wall_ns=1_700_000_000 * 10**9,
    targets=(
        CheckTarget("A", "http://a", "vllm", {"data": [{"id": "m"}]}, "0.9"),
        CheckTarget("B", "http://b"),
    ),
    baseline="A",
    sampling={"temperature": 0.0, "seed": 1, "max_tokens": 8},
    repeat=3,
    prompts="p.jsonl",
    prompt_count=2,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(rows, max_size=8))
def test_rows_round_trip(tmp_path: Path, written: list[CheckRow]) -> None:
    path = tmp_path / "c.rpc"
    writer = CheckWriter(path, HEADER)
    for row in written:
        writer.write(row)
    writer.close(answers=len(written))
    (loaded,) = load_checks([path])
    assert (
        loaded.header == HEADER and loaded.footer["answers"] == len(written) and len(loaded) == len(written)
    )
    for i, row in enumerate(written):
        values = {name: loaded.column(name)[i] for name in CHECK_FIELDS}
        assert CheckRow(**{k: v.item() if hasattr(v, "item") else v for k, v in values.items()}) == row


def test_check_and_replay_files_are_not_confused(tmp_path: Path) -> None:
    CheckWriter(tmp_path / "c.rpc", HEADER).close()
    with pytest.raises(TraceFormatError, match="replayproxy-check"):
        load_results([tmp_path / "c.rpc"])
    assert [f.header.baseline for f in load_checks([tmp_path])] == ["A"]


# The only fields that may carry the user's text; everything else is numbers, labels and hashes.
TEXT_FIELDS = {"output", "prompt_id", "target", "error_message"}


def test_only_output_holds_answer_text() -> None:
    string_fields = {
        name for name in CHECK_FIELDS if isinstance(getattr(CheckRow("A", 0, "p", 0), name), str)
    }
    assert string_fields - TEXT_FIELDS == {
        "endpoint",
        "structure",
        "error",
        "finish_reason",
        "output_hash",
        "score",
    }


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"prompt_count": 10**8, "repeat": 10**6}, "repeat 1000000 is out of range"),
        ({"prompt_count": b"\x00"}, "header's 'prompt_count' is not of type int"),
        ({"targets": [1, 2]}, "header's 'targets[0]' is not of type CheckTarget"),
        ({"baseline": "C"}, "baseline 'C' do not agree"),
        ({"prompt_count": 1}, "a row's prompt_index is outside 0..0"),
    ],
)
def test_header_counts_are_checked_against_what_can_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, object], needle: str
) -> None:
    """A 3 KB check file whose header said prompt_count 1e8 took over 60 s and 3.9 GB in `report`."""
    record = {**HEADER.to_record(), **change}
    monkeypatch.setattr(CheckHeader, "to_record", lambda self: record)
    path = tmp_path / "c.rpc"
    writer = CheckWriter(path, HEADER)
    writer.write(CheckRow("A", 1, "p", 0))
    writer.close()
    with pytest.raises(TraceFormatError, match=re.escape(needle)):
        load_checks([path])
    done = run_cli("report", str(path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and needle in done.stderr


def test_a_check_with_a_huge_prompt_count_and_few_rows_reports_at_once(tmp_path: Path) -> None:
    path = tmp_path / "c.rpc"
    writer = CheckWriter(path, dataclasses.replace(HEADER, prompt_count=10**8))
    for target in ("A", "B"):
        writer.write(CheckRow(target, 1, "p", 0, output_hash="x"))
    writer.close()
    done = run_cli("report", str(path))
    assert done.returncode == 0 and "100000000 prompts" in done.stdout
