"""replayproxy's hand-made JSON-lines workloads: named prefix segments become shared blocks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from replayproxy.formats import jsonl
from replayproxy.formats.exporting import ExportOptions
from replayproxy.formats.importing import ImportFormatError, ImportOptions, write_imported
from replayproxy.formats.profile_fit import block_reuse
from replayproxy.trace import load
from tests.formats.helpers import conversation_trace

HAND_MADE: list[dict[str, object]] = [
    {"offset_s": 0, "input_tokens": 2100, "output_tokens": 200, "prefix": [["system-A", 2000]]},
    {
        "offset_s": 0.5,
        "input_tokens": 2500,
        "output_tokens": 50,
        "prefix": [["system-A", 2000], ["doc-7", 400]],
        "model": "llama",
        "session": "u1",
    },
    {
        "offset_ms": 1500,
        "input_tokens": 1000,
        "prefix": [["system-A", 1000]],
        "endpoint": "completions",
        "stream": False,
        "session": "u1",
        "turn": 1,
    },
    {"offset_s": 2, "input_tokens": 30},
]


def import_rows(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    src = tmp_path / "w.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_imported(jsonl.read(src, ImportOptions()), tmp_path / "w.rpt", lambda: 0)
    return tmp_path / "w.rpt"


def test_segments_share_blocks_up_to_where_they_agree(tmp_path: Path) -> None:
    cols = load(import_rows(tmp_path, HAND_MADE))
    h = [cols.hashes_of(i).tolist() for i in range(4)]
    assert [len(x) for x in h] == [131, 156, 62, 1]
    assert h[0][:125] == h[1][:125] and h[0][125] != h[1][125]  # 2000 tokens = 125 full blocks
    assert h[2] == h[0][:62]  # a shorter "system-A" is a prefix of the longer one
    assert not set(h[3]) & set(h[0] + h[1])
    assert cols.output_tokens.tolist() == [200, 50, -1, -1]
    assert cols.endpoint.tolist() == ["chat", "chat", "completions", "chat"]
    assert cols.stream.tolist() == [True, True, False, True] and cols.model[1] == "llama"
    assert cols.session[1] == cols.session[2] != 0 and cols.turn.tolist() == [0, 0, 1, 0]


def test_bad_rows(tmp_path: Path) -> None:
    src = tmp_path / "b.jsonl"
    rows = [
        HAND_MADE[0],
        {"input_tokens": 5},
        {"offset_s": 1, "input_tokens": 10, "prefix": [["a", 20]]},
        {"offset_s": 1, "input_tokens": 10, "endpoint": "rpc"},
    ]
    src.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ImportFormatError, match=r"b.jsonl:2: give exactly one of offset_s and offset_ms"):
        jsonl.read(src, ImportOptions())
    imported = jsonl.read(src, ImportOptions(skip_bad=True))
    assert len(imported) == 1 and imported.bad.count == 3


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"offset_s": 1, "input_tokens": 2**31}, "input_tokens 2147483648 is not within 0..16777216"),
        ({"offset_s": 1e308, "input_tokens": 5}, "offset 1e+308 is not a number within 0..4e+09"),
        ({"offset_s": 1, "input_tokens": 5, "turn": 2**40}, "turn 1099511627776 is not within"),
        ({"offset_s": 1, "input_tokens": 5, "status": -7}, "status -7 is not within 0..999"),
        ({"offset_s": 1, "input_tokens": 5, "max_tokens": 2**40}, "max_tokens 1099511627776 is not within"),
    ],
)
def test_a_value_no_request_can_have_is_refused_with_its_line(
    tmp_path: Path, row: dict[str, object], reason: str
) -> None:
    """input_tokens 2**31 used to become 134 M block ids (46 s, 6.6 GB, then a MemoryError)."""
    src = tmp_path / "b.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [HAND_MADE[0], row]))
    with pytest.raises(ImportFormatError, match=rf"b.jsonl:2: {re.escape(reason)}"):
        jsonl.read(src, ImportOptions())
    assert len(jsonl.read(src, ImportOptions(skip_bad=True))) == 1


def test_long_prompts_are_numbered_a_group_of_blocks_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of a batch are split where their blocks pass GROUP_BLOCKS: the same ids, fewer at a time."""
    rows = [{"offset_s": i, "input_tokens": 700 + i, "prefix": [["sys", 600]]} for i in range(9)]
    whole = load([import_rows(tmp_path, rows)])
    monkeypatch.setattr(jsonl, "GROUP_BLOCKS", 100)  # 43 blocks a row: groups of two or three rows
    grouped = load([import_rows(tmp_path, rows)])
    assert whole.prefix_hashes.tolist() == grouped.prefix_hashes.tolist() and len(grouped) == 9


def test_export_reads_back_with_the_same_sharing(tmp_path: Path) -> None:
    cols = load(conversation_trace(tmp_path / "t.rpt"))
    out = tmp_path / "w.jsonl"
    jsonl.write(cols, out, ExportOptions())
    first = json.loads(out.read_text().splitlines()[0])
    assert first["prefix"][0] == ["b0", 16] and first["session"] == "s0"
    write_imported(jsonl.read(out, ImportOptions()), tmp_path / "back.rpt", lambda: 0)
    back = load(tmp_path / "back.rpt")
    assert np.array_equal(back.input_tokens, cols.input_tokens)
    assert np.array_equal(back.offset_ns, cols.offset_ns - cols.offset_ns[0])
    assert block_reuse(back)[1].tolist() == block_reuse(cols)[1].tolist()
