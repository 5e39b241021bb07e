"""Input that used to pass silently: wrong id types, bad bytes, byte-order marks, wrong units, odd zones."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from replayproxy import cli
from replayproxy.formats import azure, burstgpt, importing, jsonl, mooncake
from replayproxy.formats.importing import ImportFormatError, ImportOptions
from replayproxy.trace import load
from tests.formats.helpers import DATA, conversation_trace

GOOD = {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}


def lines(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("ids", [[True, 1], [0, 1.7], [0, "1"]])
def test_hash_ids_must_be_integers(tmp_path: Path, ids: list[object]) -> None:
    src = lines(tmp_path / "m.jsonl", [GOOD, {**GOOD, "timestamp": 1, "hash_ids": ids}])
    with pytest.raises(ImportFormatError, match=r"m.jsonl:2: hash_ids is not a list of integers"):
        mooncake.read(src, ImportOptions())
    assert len(mooncake.read(src, ImportOptions(skip_bad=True))) == 1


def test_export_refuses_a_block_size_of_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = conversation_trace(tmp_path / "t.rpt")
    out = tmp_path / "m.jsonl"
    assert cli.main(["export", str(trace), "-f", "mooncake", "-o", str(out), "--block-size", "0"]) == 2
    assert "--block-size must be positive, got 0" in capsys.readouterr().err and not out.exists()


def test_non_utf8_csv_line_is_named_and_skippable(tmp_path: Path) -> None:
    head = (DATA / "azure_conv_2023_head60.csv").read_bytes().split(b"\n")
    head[3] = head[3].replace(b",", b"\xff,", 1)
    src = tmp_path / "a.csv"
    src.write_bytes(b"\n".join(head))
    with pytest.raises(ImportFormatError, match=r"a.csv:4: not UTF-8 text \(byte 0xff\).*--skip-bad"):
        azure.read(src, ImportOptions())
    imported = azure.read(src, ImportOptions(skip_bad=True))
    assert len(imported) == 59 and imported.bad.count == 1


def test_burstgpt_non_utf8_line_is_skippable(tmp_path: Path) -> None:
    src = tmp_path / "b.csv"
    src.write_bytes(
        b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        b"5,ChatGPT,10,20,30,Conversation log\n"
        b"6,Chat\xc3GPT,10,20,30,Conversation log\n"
        b"7,ChatGPT,11,21,32,Conversation log\n"
    )
    with pytest.raises(ImportFormatError, match=r"b.csv:3: not UTF-8"):
        burstgpt.read(src, ImportOptions())
    assert burstgpt.read(src, ImportOptions(skip_bad=True)).input_tokens.tolist() == [10, 11]


def test_byte_order_mark_is_accepted_in_csv_and_json_lines(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    csv_file = tmp_path / "a.csv"
    csv_file.write_bytes(bom + (DATA / "azure_conv_2023_head60.csv").read_bytes())
    assert len(azure.read(csv_file, ImportOptions())) == 60
    moon = tmp_path / "m.jsonl"
    moon.write_bytes(bom + json.dumps(GOOD).encode() + b"\n")
    assert len(mooncake.read(moon, ImportOptions())) == 1
    own = tmp_path / "j.jsonl"
    own.write_bytes(bom + b'{"offset_s": 0, "input_tokens": 5}\n')
    assert len(jsonl.read(own, ImportOptions())) == 1


def test_an_overlong_line_is_a_bad_line_not_a_memory_blowup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importing, "MAX_LINE_BYTES", 1 << 20)  # the rule, at a size a test can afford
    src = tmp_path / "m.jsonl"
    huge = {**GOOD, "input_length": 600, "pad": "x" * (2 << 20)}
    lines(src, [GOOD, huge, {**GOOD, "timestamp": 2}])
    with pytest.raises(ImportFormatError, match=r"m.jsonl:2: a line of \d+ bytes"):
        mooncake.read(src, ImportOptions())
    assert len(mooncake.read(src, ImportOptions(skip_bad=True))) == 2


def test_exporting_a_damaged_trace_says_what_was_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = conversation_trace(tmp_path / "t.rpt")
    data = trace.read_bytes()
    trace.write_bytes(data[: len(data) - 600])  # the one request frame loses its tail
    assert cli.main(["export", str(trace), "-f", "mooncake", "-o", str(tmp_path / "m.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "no readable requests" in err and "6 records lost" in err and err.count("\n") == 1


def test_seconds_option_on_a_millisecond_file_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = DATA / "mooncake_conversation_head300.jsonl"
    args = ["import", str(src), "-f", "mooncake", "-o", str(tmp_path / "t.rpt")]
    assert cli.main(args) == 0
    assert "warning" not in capsys.readouterr().out
    assert cli.main([*args, "--time-unit", "s"]) == 0
    out = capsys.readouterr().out
    assert "use --time-unit ms" in out


def test_a_month_long_import_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = lines(tmp_path / "m.jsonl", [GOOD, {**GOOD, "timestamp": 41 * 86_400_000}])
    assert cli.main(["import", str(src), "-f", "mooncake", "-o", str(tmp_path / "t.rpt")]) == 0
    assert "span 41 days (timestamps read as ms: is --time-unit right?)" in capsys.readouterr().out


def test_milliseconds_on_a_seconds_file_warns(tmp_path: Path) -> None:
    rows = [{**GOOD, "timestamp": round(0.137 * i, 3) + 0.0005} for i in range(40)]
    src = lines(tmp_path / "m.jsonl", rows)
    assert any("use --time-unit s" in w for w in mooncake.read(src, ImportOptions()).warnings)
    assert mooncake.read(src, ImportOptions(time_unit="s")).warnings == []


def test_zone_offsets_are_honoured_per_row_and_a_stray_one_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "a.csv"
    src.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,10,5\n"
        "2024-05-10 00:00:01+00:00,11,5\n"
        "2024-05-10 02:00:02.5+02:00,12,5\n"
        "2024-05-10 00:00:03+00:00,13,5\n"
    )
    out = tmp_path / "t.rpt"
    assert cli.main(["import", str(src), "-f", "azure", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "a.csv:4: 1 rows name another zone (+02:00) than the first row (+00:00)" in printed
    cols = load(out)
    assert cols.input_tokens.tolist() == [10, 11, 12, 13]  # 02:00:02.5+02:00 is 00:00:02.5 UTC
    assert cols.offset_ns.tolist() == [0, 990_070_000, 2_490_070_000, 2_990_070_000]


def test_a_huge_single_line_is_measured_in_pieces_never_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importing, "MAX_LINE_BYTES", 1 << 20)
    monkeypatch.setattr(importing, "BATCH_BYTES", 1 << 20)
    src = tmp_path / "one.jsonl"
    line = b'{"timestamp": 0, "input_length": 1, "pad": "' + b"x" * (24 << 20) + b'"}'
    src.write_bytes(line)
    tracemalloc.start()
    try:
        with pytest.raises(ImportFormatError, match=rf"one.jsonl:1: a line of {len(line)} bytes"):
            mooncake.read(src, ImportOptions())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak} bytes for a 24 MiB line"
