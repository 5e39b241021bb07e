"""Qwen-Bailian traces: the published layout in, the same layout out (16-token blocks, sessions)."""

from __future__ import annotations

import csv
import json
import secrets
from pathlib import Path

import pytest

from replayproxy import cli
from replayproxy.formats import bailian, csv_format
from replayproxy.formats.exporting import ExportOptions
from replayproxy.formats.importing import ImportFormatError, ImportOptions, write_imported
from replayproxy.trace import ReadReport, load
from replayproxy.trace.frames import iter_frame_payloads
from tests.formats import consumers
from tests.formats.helpers import conversation_trace

# The README's example row and a follow-up turn of the same chat, in the published field order.
FIRST_TURN_IDS = [1089, 1090, 1091, 6326, *range(13148, 13177)]  # 33 blocks of 16 tokens: 521 tokens
ROWS = [
    {
        "chat_id": 159,
        "parent_chat_id": -1,
        "timestamp": 61.114,
        "input_length": 521,
        "output_length": 132,
        "type": "text",
        "turn": 1,
        "hash_ids": FIRST_TURN_IDS,
    },
    {
        "chat_id": 160,
        "parent_chat_id": -1,
        "timestamp": 61.5,
        "input_length": 17,
        "output_length": 5,
        "type": "search",
        "turn": 1,
        "hash_ids": [1089, 20000],
    },
    {
        "chat_id": 161,
        "parent_chat_id": 159,
        "timestamp": 75.25,
        "input_length": 680,
        "output_length": 40,
        "type": "text",
        "turn": 2,
        "hash_ids": [*FIRST_TURN_IDS, *range(30001, 30011)],
    },
]


def test_published_layout_imports_sessions_turns_and_sharing(tmp_path: Path) -> None:
    src = tmp_path / "qwen_traceA_blksz_16.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    imported = bailian.read(src, ImportOptions())
    write_imported(imported, tmp_path / "t.rpt", lambda: 0)
    cols = load(tmp_path / "t.rpt")
    assert cols.offset_ns.tolist() == [0, 386_000_000, 14_136_000_000]
    assert cols.headers[0].block_size == 16 and cols.headers[0].extra["request_types"] == ["search", "text"]
    assert cols.turn.tolist() == [0, 0, 1]
    assert cols.session[0] == cols.session[2] != 0 and cols.session[1] == 0
    assert cols.hashes_of(2)[:32].tolist() == cols.hashes_of(0).tolist()  # 521 tokens: 32 full blocks
    assert cols.hashes_of(1)[0] == cols.hashes_of(0)[0]


def test_a_file_without_follow_up_turns_prints_aiperf(tmp_path: Path) -> None:
    src = tmp_path / "roots.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in ROWS[:2]))
    write_imported(bailian.read(src, ImportOptions()), tmp_path / "r.rpt", lambda: 0)
    result = bailian.write(load(tmp_path / "r.rpt"), tmp_path / "b.jsonl", ExportOptions())
    assert "--custom-dataset-type bailian_trace --isl-block-size 16" in result.notes[0]


def test_bad_rows_are_named(tmp_path: Path) -> None:
    src = tmp_path / "b.jsonl"
    rows = [ROWS[0], {**ROWS[1], "chat_id": "x"}, {**ROWS[1], "hash_ids": [1, 2, 3]}]
    src.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ImportFormatError, match=r"b.jsonl:2: chat_id is 'x', not an integer"):
        bailian.read(src, ImportOptions())
    imported = bailian.read(src, ImportOptions(skip_bad=True))
    assert len(imported) == 1 and imported.bad.count == 2


def test_export_is_the_published_layout_and_reads_back(tmp_path: Path) -> None:
    cols = load(conversation_trace(tmp_path / "t.rpt"))
    out = tmp_path / "b.jsonl"
    result = bailian.write(cols, out, ExportOptions())
    rows = consumers.read_rows(out)
    assert list(rows[0]) == [
        "chat_id",
        "parent_chat_id",
        "timestamp",
        "input_length",
        "output_length",
        "type",
        "turn",
        "hash_ids",
    ]
    assert [r["parent_chat_id"] for r in rows] == [-1, -1, 0, -1, -1, -1]
    assert [r["turn"] for r in rows] == [1, 1, 2, 1, 1, 1] and rows[2]["timestamp"] == 0.9
    assert consumers.guidellm_problems(rows, 16) == []
    as_ms = [{**r, "timestamp": round(r["timestamp"] * 1000)} for r in rows]  # AIPerf converts s to ms
    assert consumers.aiperf_problems(as_ms, 16) == []
    # a multi-turn file is not for AIPerf, which would append the earlier turns a second time
    assert not any("bailian_trace" in n for n in result.notes)
    assert any("mooncake --sessions" in n for n in result.notes)
    again = bailian.read(out, ImportOptions())
    assert again.input_tokens.tolist() == cols.input_tokens.tolist() and len(again) == 6


def test_request_type_is_kept_through_import_and_export(tmp_path: Path) -> None:
    rows = [ROWS[0], {**ROWS[1], "type": "image"}, {**ROWS[2], "type": "file"}]
    src = tmp_path / "typed.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_imported(bailian.read(src, ImportOptions()), tmp_path / "t.rpt", lambda: 0)
    cols = load(tmp_path / "t.rpt")
    assert cols.request_type.tolist() == ["text", "image", "file"]
    out = tmp_path / "out.jsonl"
    bailian.write(cols, out, ExportOptions())
    assert [r["type"] for r in consumers.read_rows(out)] == ["text", "image", "file"]
    csv_out = tmp_path / "t.csv"
    csv_format.write(cols, csv_out, ExportOptions())
    with open(csv_out, newline="") as stream:
        assert [r["request_type"] for r in csv.DictReader(stream)] == ["text", "image", "file"]


def test_request_type_never_carries_a_files_text_into_the_trace(tmp_path: Path) -> None:
    """The field is a closed set: a crafted value (any text) becomes "other", in rows and header."""
    secret = "type-" + secrets.token_hex(16)
    rows = [
        {**ROWS[0], "type": secret},
        {**ROWS[1], "type": 7},
        {k: v for k, v in ROWS[2].items() if k != "type"},
    ]
    src = tmp_path / "crafted.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace_file = tmp_path / "t.rpt"
    write_imported(bailian.read(src, ImportOptions()), trace_file, lambda: 0)
    cols = load(trace_file)
    assert cols.request_type.tolist() == ["other", "other", ""]
    assert cols.headers[0].extra["request_types"] == ["", "other"]
    data = trace_file.read_bytes()
    plain = b"".join(bytes(p) for p in iter_frame_payloads(data, str(trace_file), ReadReport()))
    assert secret.encode()[5:13] not in plain and b"other" in plain  # decompressed: the class, no text


def test_per_block_ids_are_chained_and_the_blocks_that_change_meaning_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bailian ids name a block's content wherever it sits: id 7 after [1, 2] and after [5] are
    not the same cached prefix. Chained, the second 7 is a new block; the import says how many."""
    rows = [
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 48, "output_length": 1,
         "type": "text", "turn": 1, "hash_ids": [1, 2, 7]},
        {"chat_id": 2, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 32, "output_length": 1,
         "type": "text", "turn": 1, "hash_ids": [5, 7]},
        {"chat_id": 3, "parent_chat_id": -1, "timestamp": 2.0, "input_length": 40, "output_length": 1,
         "type": "text", "turn": 1, "hash_ids": [1, 2, 7]},  # a true hit: same prefix
    ]  # fmt: skip
    src = tmp_path / "b.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    imported = bailian.read(src, ImportOptions())
    assert imported.extra["blocks_changed_meaning"] == 1
    assert imported.notes == [
        "1 of 7 blocks changed meaning: their id was seen before after another prefix (a hit by id, "
        "not by prefix); chained, they are new blocks"
    ]
    write_imported(imported, tmp_path / "b.rpt", lambda: 0)
    cols = load(tmp_path / "b.rpt")
    assert cols.hashes_of(0)[2] != cols.hashes_of(1)[1]  # the two 7s are different blocks
    assert cols.hashes_of(0)[:2].tolist() == cols.hashes_of(2)[:2].tolist()
    assert len(cols.hashes_of(2)) == 2  # 40 tokens: two full 16-token blocks
    out = tmp_path / "o.rpt"
    assert cli.main(["import", str(src), "--format", "bailian", "-o", str(out)]) == 0
    assert "1 of 7 blocks changed meaning" in capsys.readouterr().out
