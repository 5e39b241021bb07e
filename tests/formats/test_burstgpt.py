"""BurstGPT CSVs (files 1-2 and the BurstGPT_3 layout): failed requests, sessions, bad lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from replayproxy.formats import burstgpt
from replayproxy.formats.importing import ImportFormatError, ImportOptions, write_imported
from replayproxy.trace import load

V1 = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,API log
"""
V3 = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
10,abc,2.5,ChatGPT,100,20,120,Conversation log
12,,1.25,GPT-4,50,10,60,API log
30,abc,3.0,ChatGPT,300,40,340,Conversation log
"""


def test_files_one_and_two(tmp_path: Path) -> None:
    src = tmp_path / "BurstGPT_1.csv"
    src.write_text(V1)
    write_imported(burstgpt.read(src, ImportOptions()), tmp_path / "t.rpt", lambda: 0)
    cols = load(tmp_path / "t.rpt")
    assert cols.offset_ns.tolist() == [0, 40_000_000_000, 113_000_000_000]
    assert cols.model.tolist() == ["ChatGPT", "ChatGPT", "GPT-4"]
    assert cols.output_tokens.tolist() == [18, 0, 276]
    assert cols.error.tolist() == ["", "other", ""] and cols.status.tolist() == [200, 0, 200]
    assert cols.headers[0].extra["failed_requests"] == 1


def test_drop_failed(tmp_path: Path) -> None:
    src = tmp_path / "b.csv"
    src.write_text(V1)
    imported = burstgpt.read(src, ImportOptions(drop_failed=True))
    assert imported.output_tokens.tolist() == [18, 276] and imported.extra["dropped_failed"] == 1


def test_burstgpt_3_sessions_and_elapsed_time(tmp_path: Path) -> None:
    src = tmp_path / "BurstGPT_3.csv"
    src.write_text(V3)
    write_imported(burstgpt.read(src, ImportOptions()), tmp_path / "t.rpt", lambda: 0)
    cols = load(tmp_path / "t.rpt")
    assert cols.e2e_ns.tolist() == [2_500_000_000, 1_250_000_000, 3_000_000_000]
    assert cols.session[0] == cols.session[2] != 0 and cols.session[1] == 0
    assert cols.turn.tolist() == [0, 0, 1]


def test_bad_lines(tmp_path: Path) -> None:
    src = tmp_path / "b.csv"
    src.write_text(V1 + "7,ChatGPT,ten,3,13,API log\n9,ChatGPT,-4,3,-1,API log\n9,ChatGPT,1,2\n")
    with pytest.raises(ImportFormatError, match=r"b.csv:5: 'ten' is not a number"):
        burstgpt.read(src, ImportOptions())
    imported = burstgpt.read(src, ImportOptions(skip_bad=True))
    assert len(imported) == 3 and imported.bad.count == 3
