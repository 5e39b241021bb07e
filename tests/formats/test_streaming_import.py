"""Every reader streams: batches of a few lines, hashes spilled to the temporary file, and the trace
written is byte for byte the one a single batch gives; on the public files, exact against a plain
row-by-row reading of the raw file."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from replayproxy.formats import chained_hashes, csv_rows, importing, tracelab
from replayproxy.formats.importing import ImportOptions, write_imported
from replayproxy.formats.registry import reader
from replayproxy.trace import load
from tests.formats.helpers import DATA, SHARED_TRACES
from tests.formats.test_tracelab import sample as tracelab_sample

CONVERSATION = SHARED_TRACES / "conversation_trace.jsonl"
AZURE = SHARED_TRACES / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = CONVERSATION if CONVERSATION.exists() else DATA / "mooncake_conversation_head300.jsonl"


def mooncake_rows() -> list[dict[str, object]]:
    return [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]


def sessions_file(path: Path) -> Path:
    """Mooncake rows with AIPerf sessions: later turns carry a delay and no timestamp."""
    rows = mooncake_rows()[:2000]
    for i, row in enumerate(rows):
        if i % 3 == 0:
            row["session_id"] = f"s{i % 40}"
            if i % 2:
                row["delay"] = 1500.5
                del row["timestamp"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    return path


def bailian_file(path: Path) -> Path:
    """The conversation rows as Bailian chats (512-token ids), follow-ups linked to earlier chats."""
    rows = []
    for i, row in enumerate(mooncake_rows()[:2000]):
        parent = i - 3 if i % 4 == 3 else -1
        rows.append(
            {
                "chat_id": i,
                "parent_chat_id": parent,
                "timestamp": row["timestamp"] / 1000,  # type: ignore[operator]
                "input_length": row["input_length"],
                "output_length": row["output_length"],
                "type": ["text", "search", "image", "file"][i % 4],
                "turn": 2 if parent >= 0 else 1,
                "hash_ids": row["hash_ids"],
            }
        )
    rows[10]["parent_chat_id"], rows[11]["parent_chat_id"] = 11, 10  # a loop ends where it comes back
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def burstgpt_file(path: Path) -> Path:
    lines = ["Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for i in range(3000):
        session = f"c{i % 70}" if i % 5 else ""
        model = "GPT-4" if i % 3 else "ChatGPT"
        lines.append(f"{i * 1.5},{session},{i % 7 / 2},{model},{i % 900 + 1},{i % 11},0,API log")
    lines.insert(1234, "12,,1,ChatGPT,ten,3,13,API log")
    path.write_text("\n".join(lines) + "\n")
    return path


def jsonl_file(path: Path) -> Path:
    rows = [
        {"offset_s": i / 100, "input_tokens": 100 + i % 700, "prefix": [["system", 64 + i % 3 * 16]]}
        for i in range(3000)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


CASES = {
    "mooncake": lambda tmp: MOONCAKE,
    "mooncake-sessions": lambda tmp: sessions_file(tmp / "s.jsonl"),
    "bailian": lambda tmp: bailian_file(tmp / "b.jsonl"),
    "azure": lambda tmp: AZURE if AZURE.exists() else DATA / "azure_conv_2023_head60.csv",
    "burstgpt": lambda tmp: burstgpt_file(tmp / "g.csv"),
    "tracelab": lambda tmp: tracelab_sample(tmp / "t.jsonl"),
    "jsonl": lambda tmp: jsonl_file(tmp / "w.jsonl"),
}
OPTIONS = {"bailian": ImportOptions(block_size=512, skip_bad=True), "tracelab": ImportOptions(block_size=16)}


def import_bytes(fmt: str, source: Path, out: Path) -> tuple[bytes, int]:
    options = OPTIONS.get(fmt, ImportOptions(skip_bad=True))
    imported = reader(fmt.split("-")[0])(source, options)
    write_imported(imported, out, lambda: 0)
    return out.read_bytes(), imported.bad.count


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_tiny_batches_and_spilled_hashes_write_the_same_trace(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = CASES[fmt](tmp_path)
    whole, bad = import_bytes(fmt, source, tmp_path / "whole.rpt")
    monkeypatch.setattr(importing, "BATCH_BYTES", 4096)  # a few lines per batch
    monkeypatch.setattr(csv_rows, "BATCH_ROWS", 37)
    monkeypatch.setattr(tracelab, "CHAIN_ROWS", 3)
    monkeypatch.setattr(chained_hashes, "MEMORY_BYTES", 1000)  # hashes go to the temporary file
    batched, batched_bad = import_bytes(fmt, source, tmp_path / "batched.rpt")
    assert batched == whole and batched_bad == bad
    cols = load(tmp_path / "batched.rpt")
    assert len(cols) > 0 and (fmt in ("azure", "burstgpt") or len(cols.prefix_hashes) > 0)


@pytest.mark.skipif(not CONVERSATION.exists(), reason="public Mooncake trace not present")
def test_public_mooncake_trace_is_exact_against_its_raw_rows(tmp_path: Path) -> None:
    raw = mooncake_rows()
    import_bytes("mooncake", CONVERSATION, tmp_path / "t.rpt")
    cols = load(tmp_path / "t.rpt")
    times = np.array([r["timestamp"] for r in raw], np.int64) * 1_000_000
    assert len(cols) == len(raw) == 12031
    assert cols.offset_ns.tolist() == (times - times.min()).tolist()
    for name, field in (("input_tokens", "input_length"), ("output_tokens", "output_length")):
        column, values = getattr(cols, name), np.array([r[field] for r in raw])
        assert int(column.sum()) == int(values.sum())
        assert np.percentile(column, [50, 90, 99]).tolist() == np.percentile(values, [50, 90, 99]).tolist()
    full = [len(r["hash_ids"][: r["input_length"] // 512]) for r in raw]  # type: ignore[index, operator]
    assert np.diff(cols.prefix_index).tolist() == full


@pytest.mark.skipif(not AZURE.exists(), reason="public Azure trace not present")
def test_public_azure_trace_is_exact_against_its_raw_rows(tmp_path: Path) -> None:
    with open(AZURE, newline="") as stream:
        raw = list(csv.DictReader(stream))
    import_bytes("azure", AZURE, tmp_path / "t.rpt")
    cols = load(tmp_path / "t.rpt")

    def ns(text: str) -> int:  # 7 fractional digits: whole seconds and the digits as nanoseconds
        day, fraction = text.split(".")
        seconds = int(datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp())
        return seconds * 1_000_000_000 + int(fraction.ljust(9, "0"))

    times = np.array([ns(r["TIMESTAMP"]) for r in raw], np.int64)
    assert len(cols) == len(raw) == 19366
    assert cols.headers[0].start_wall_ns == times.min()
    assert sorted(cols.offset_ns.tolist()) == sorted((times - times.min()).tolist())
    for name, field in (("input_tokens", "ContextTokens"), ("output_tokens", "GeneratedTokens")):
        column, values = getattr(cols, name), np.array([int(r[field]) for r in raw])
        assert int(column.sum()) == int(values.sum())
        assert np.percentile(column, [50, 90, 99]).tolist() == np.percentile(values, [50, 90, 99]).tolist()
