"""TraceLab import: agent rounds become sessions with tool waits and the recorded prefix reuse."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replayproxy.formats import tracelab
from replayproxy.formats.importing import ImportFormatError, ImportOptions, write_imported
from replayproxy.formats.profile_fit import block_reuse
from replayproxy.trace import load

AIPERF_PYTHON = os.environ.get("REPLAYPROXY_AIPERF_PYTHON", "")


def round_row(
    session: str, index: int, sent: str, done: str, total: int, prefix: int, out: int
) -> dict[str, Any]:
    return {
        "session_id": session,
        "round_index": index,
        "model": "claude-sonnet",
        "input_tokens_total": total,
        "prefix_tokens": prefix,
        "newly_append_tokens": total - prefix,
        "output_tokens": out,
        "timing_events": [
            {"event_type": "tool_result" if index else "user_message", "timestamp": sent},
            {"event_type": "tool_call", "timestamp": done},
        ],
    }


def sample(path: Path) -> Path:
    rows = [
        round_row("a", 0, "2025-06-01T10:00:00Z", "2025-06-01T10:00:04Z", 2000, 0, 100),
        round_row("b", 0, "2025-06-01T10:00:01Z", "2025-06-01T10:00:02Z", 700, 0, 30),
        round_row("a", 1, "2025-06-01T10:00:09Z", "2025-06-01T10:00:10.5Z", 2300, 2000, 40),  # 5 s tool wait
        round_row("a", 2, "2025-06-01T10:00:12Z", "2025-06-01T10:00:13Z", 1200, 640, 20),  # compacted context
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rounds_become_sessions_with_waits_and_reuse(tmp_path: Path) -> None:
    write_imported(
        tracelab.read(sample(tmp_path / "t.jsonl"), ImportOptions()), tmp_path / "t.rpt", lambda: 0
    )
    cols = load(tmp_path / "t.rpt")
    assert cols.offset_ns.tolist() == [0, 1_000_000_000, 9_000_000_000, 12_000_000_000]
    assert cols.input_tokens.tolist() == [2000, 700, 2300, 1200]
    assert cols.turn.tolist() == [0, 0, 1, 2] and cols.session[0] == cols.session[2] != cols.session[1]
    assert cols.e2e_ns.tolist() == [4e9, 1e9, 1.5e9, 1e9]
    # Think time (end of a round to the next round of the session) is the tool wait: 9 - (0 + 4) s.
    assert (cols.offset_ns[2] - (cols.offset_ns[0] + cols.e2e_ns[0])) / 1e9 == 5.0
    assert cols.headers[0].start_wall_ns == 1_748_772_000_000_000_000 and cols.model[0] == "claude-sonnet"
    blocks, reused = block_reuse(cols)
    assert blocks.tolist() == [31, 10, 35, 18]  # full 64-token blocks
    assert reused.tolist() == [
        0,
        0,
        31,
        10,
    ]  # all 2000 cached tokens' blocks, then 640 // 64 after compaction
    assert np.array_equal(cols.hashes_of(3)[:10], cols.hashes_of(2)[:10])


def test_bad_round_is_named(tmp_path: Path) -> None:
    src = sample(tmp_path / "t.jsonl")
    src.write_text(src.read_text() + '{"session_id": "a", "input_tokens_total": 5, "timing_events": []}\n')
    with pytest.raises(ImportFormatError, match=r"t.jsonl:5: no timed event"):
        tracelab.read(src, ImportOptions())
    assert len(tracelab.read(src, ImportOptions(skip_bad=True))) == 4


@pytest.mark.skipif(
    not AIPERF_PYTHON, reason="opt-in: REPLAYPROXY_AIPERF_PYTHON=<python with aiperf installed>"
)
def test_same_send_times_and_block_chains_as_aiperfs_tracelab_reader(tmp_path: Path) -> None:
    src = sample(tmp_path / "t.jsonl")
    check = (
        "import json, sys\n"
        "from collections import defaultdict\n"
        "from aiperf.dataset.loader._tracelab_convert import (\n"
        "    HashIdMinter, order_rounds, synthesize_hash_ids)\n"
        "rows = [json.loads(l) for l in open(sys.argv[1])]\n"
        "by = defaultdict(list)\n"
        "[by[r['session_id']].append(r) for r in rows]\n"
        "out = {}\n"
        "for s, rs in by.items():\n"
        "    timed = order_rounds(rs)\n"
        "    chains = synthesize_hash_ids([t[2] for t in timed], 64, HashIdMinter())\n"
        "    pairs = zip(timed, chains, [[]] + chains)\n"
        "    out[s] = [[t[0], t[1], len(c), sum(x in p for x in c)] for t, c, p in pairs]\n"
        "print(json.dumps(out))\n"
    )
    run = subprocess.run([AIPERF_PYTHON, "-c", check, str(src)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    theirs = json.loads(run.stdout)
    write_imported(tracelab.read(src, ImportOptions()), tmp_path / "t.rpt", lambda: 0)
    cols = load(tmp_path / "t.rpt")
    blocks, reused = block_reuse(cols)
    start = cols.headers[0].start_wall_ns / 1e9
    ours: dict[str, list[list[float]]] = {"a": [], "b": []}
    for i, name in enumerate(["a", "b", "a", "a"]):
        ours[name].append(
            [start + cols.offset_ns[i] / 1e9, cols.e2e_ns[i] / 1e9, int(blocks[i]), int(reused[i])]
        )
    assert ours == theirs
