"""The trace header (replayproxy/trace/header.py): what a reader needs from a file, and the version gate."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from replayproxy import trace
from replayproxy.shape import FIELD_KINDS, FIELDS
from replayproxy.trace import TraceFormatError, TraceHeader
from replayproxy.trace.header import checked_fields
from tests.trace.helpers import FakeClock, frames_with_header


def test_header_round_trips_and_records_when_the_file_was_created(tmp_path: Path) -> None:
    header = TraceHeader(
        start_wall_ns=123,
        source="synth",
        block_size=32,
        block_unit="char",
        key_fingerprint="ab" * 8,
        upstream="http://u",
        tokenizer="tok",
        recorder="replayproxy 0",
        extra={"note": 1},
    )
    clock = FakeClock()
    trace.write_trace(tmp_path / "t.rpt", header, [], mono_ns=clock.mono_ns, wall_ns=clock.wall_ns)
    (read,) = trace.load(tmp_path / "t.rpt").headers
    assert read == replace(header, created_wall_ns=clock.wall)


def test_the_record_names_every_field_with_its_kind() -> None:
    record = TraceHeader(start_wall_ns=0).to_record()
    assert record["type"] == "header" and record["format"] == trace.FORMAT_NAME
    assert record["fields"] == list(FIELDS) and record["kinds"] == FIELD_KINDS
    assert TraceHeader.from_record(record) == TraceHeader(start_wall_ns=0)


def test_newer_major_version_is_refused_clearly(tmp_path: Path) -> None:
    header = TraceHeader(start_wall_ns=0).to_record() | {"version": trace.FORMAT_VERSION + 1}
    path = tmp_path / "new.rpt"
    path.write_bytes(frames_with_header(header, []))
    with pytest.raises(TraceFormatError, match=r"format version 3 is newer than this reader \(2\); upgrade"):
        trace.load(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"start_wall_ns": None}, "header's 'start_wall_ns' is not of type int"),
        ({"block_size": "16"}, "header's 'block_size' is not of type int"),
        ({"fields": "offset_ns"}, "header's 'fields' is not of type"),
    ],
)
def test_a_header_entry_of_the_wrong_type_is_a_format_error(change: dict[str, Any], message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        TraceHeader.from_record(TraceHeader(start_wall_ns=0).to_record() | change)


def test_a_header_without_its_required_entry_is_a_format_error(tmp_path: Path) -> None:
    record = TraceHeader(start_wall_ns=0).to_record()
    del record["start_wall_ns"]
    with pytest.raises(TraceFormatError, match="header lacks 'start_wall_ns'"):
        checked_fields(TraceHeader, record)
    path = tmp_path / "headless.rpt"
    path.write_bytes(frames_with_header(record, []))
    with pytest.raises(TraceFormatError, match="lacks 'start_wall_ns'") as info:
        trace.load(path)
    assert str(path) in str(info.value)


def test_unknown_header_entries_are_ignored() -> None:
    record = TraceHeader(start_wall_ns=5).to_record() | {"written_by_a_newer_minor": [1, 2]}
    assert checked_fields(TraceHeader, record)["start_wall_ns"] == 5
    assert TraceHeader.from_record(record).start_wall_ns == 5
