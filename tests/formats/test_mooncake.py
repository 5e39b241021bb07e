"""Mooncake import (published layout, units, bad lines) and export (consumer rules, round trip)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from replayproxy.formats import mooncake
from replayproxy.formats.exporting import ExportOptions
from replayproxy.formats.importing import ImportFormatError, ImportOptions, write_imported
from replayproxy.formats.profile_fit import block_reuse
from replayproxy.shape import RequestShape
from replayproxy.trace import TraceHeader, load, write_trace
from tests.formats import consumers
from tests.formats.helpers import DATA, SHARED_TRACES, conversation_trace, shape, tokens, write

SAMPLE = DATA / "mooncake_conversation_head300.jsonl"


S = 1_000_000_000


def import_file(src: Path, out: Path, **options: object) -> Path:
    write_imported(mooncake.read(src, ImportOptions(**options)), out, lambda: 0)  # type: ignore[arg-type]
    return out


def partition(values: np.ndarray) -> np.ndarray:
    """Each value replaced by the position of its first occurrence: equal partitions compare equal."""
    _, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    return first[inverse]


def test_published_sample_imports_with_sharing_from_hash_ids(tmp_path: Path) -> None:
    cols = load(import_file(SAMPLE, tmp_path / "t.rpt"))
    rows = consumers.read_rows(SAMPLE)
    assert len(cols) == 300
    assert cols.input_tokens.tolist() == [r["input_length"] for r in rows]
    assert cols.output_tokens.tolist() == [r["output_length"] for r in rows]
    assert (cols.offset_ns // 1_000_000).tolist() == [r["timestamp"] for r in rows]
    assert cols.headers[0].block_size == 512 and cols.headers[0].source == "import:mooncake"
    # Only full blocks are hashed; every request starts with the shared id 0.
    assert np.diff(cols.prefix_index).tolist() == [r["input_length"] // 512 for r in rows]
    firsts = cols.prefix_hashes[cols.prefix_index[:-1][np.diff(cols.prefix_index) > 0]]
    assert len(set(firsts.tolist())) == 1
    # Equal hash ids at full blocks <=> equal prefix hashes.
    pairs = {
        (h, int(x))
        for r, i in zip(rows, range(300), strict=True)
        for h, x in zip(r["hash_ids"][: r["input_length"] // 512], cols.hashes_of(i), strict=False)
    }
    assert len({h for h, _ in pairs}) == len(pairs) == len({x for _, x in pairs})


def test_round_trip_keeps_counts_times_lengths_and_block_sharing(tmp_path: Path) -> None:
    first = load(import_file(SAMPLE, tmp_path / "a.rpt"))
    mooncake.write(first, tmp_path / "a.jsonl", ExportOptions())
    second = load(import_file(tmp_path / "a.jsonl", tmp_path / "b.rpt"))
    for name in ("offset_ns", "input_tokens", "output_tokens", "prefix_units"):
        assert np.array_equal(first.scalar[name], second.scalar[name]), name
    assert np.array_equal(first.prefix_index, second.prefix_index)
    assert np.array_equal(partition(first.prefix_hashes), partition(second.prefix_hashes))
    assert block_reuse(first)[1].sum() == block_reuse(second)[1].sum() > 0


@pytest.mark.parametrize("block", [512, 64, 16])
def test_export_obeys_every_consumers_rules(tmp_path: Path, block: int) -> None:
    cols = load(conversation_trace(tmp_path / "t.rpt"))
    out = tmp_path / "m.jsonl"
    result = mooncake.write(cols, out, ExportOptions(block_size=block))
    assert consumers.all_problems(out, block) == []
    rows = consumers.read_rows(out)
    assert [r["timestamp"] for r in rows] == [0, 250, 900, 1500, 1500, 3001]
    assert rows[0]["hash_ids"][: 1024 // block] == rows[1]["hash_ids"][: 1024 // block]  # system prompt
    ids = sorted({h for r in rows for h in r["hash_ids"]})
    assert ids == list(range(len(ids)))  # consecutive ints in first-seen order
    commands = "\n".join(result.notes)
    assert f"--isl-block-size {block}" in commands and f"hash_id_block_size={block}" in commands
    assert (
        f"--timed-trace-chunk-hash-size {block}" in commands
        and "--timed-trace-sec-multiplier 0.001" in commands
    )
    assert "time_scale=0.001" in commands and "SGLang:   needs --block-size 128" in commands


def test_consumer_checks_can_fail() -> None:
    rows = [
        {"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]},
        {"timestamp": 1, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1, 2]},
    ]
    problems = consumers.aiperf_problems(rows, 512) + consumers.guidellm_problems(rows, 512)
    assert any("materialized" in p for p in problems) and any("not sorted" in p for p in problems)
    assert any("!= 3 blocks" in p for p in problems)
    assert consumers.vllm_timed_trace_problems(rows, 16)


def test_partial_blocks_never_share_an_id_with_a_full_block(tmp_path: Path) -> None:
    cols = load(conversation_trace(tmp_path / "t.rpt"))
    rows = list(mooncake.mooncake_rows(cols, 512))
    # Request 1 (1107 tokens) ends inside block 2 while request 2 (1490 tokens) has it full.
    assert rows[1]["hash_ids"][:2] == rows[2]["hash_ids"][:2]
    assert rows[1]["hash_ids"][2] not in {h for r in rows[2:] for h in r["hash_ids"]}


def test_sessions_add_session_id_and_delay_for_follow_up_turns(tmp_path: Path) -> None:
    cols = load(conversation_trace(tmp_path / "t.rpt"))
    rows = list(mooncake.mooncake_rows(cols, 512, sessions=True))
    assert rows[0]["session_id"] == rows[2]["session_id"] == "s0" and rows[0]["timestamp"] == 0
    assert "timestamp" not in rows[2] and rows[2]["delay"] == 900  # previous turn's E2E unknown: 0
    assert "session_id" not in rows[1]


def test_seconds_timestamps_and_other_block_sizes(tmp_path: Path) -> None:
    src = tmp_path / "s.jsonl"
    src.write_text(
        '{"timestamp": 1.5, "input_length": 40, "output_length": 3, "hash_ids": [7, 8, 9]}\n'
        '{"timestamp": 0.25, "input_length": 33, "output_length": 4, "hash_ids": [7, 8, 10]}\n'
    )
    cols = load(import_file(src, tmp_path / "s.rpt", time_unit="s", block_size=16))
    assert cols.offset_ns.tolist() == [0, 1_250_000_000]  # sorted, rebased to the first request
    assert cols.headers[0].block_size == 16
    assert cols.hashes_of(0).tolist() == cols.hashes_of(1).tolist()  # two full blocks each, equal ids


def test_bad_line_names_file_line_and_reason(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    good = '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}'
    src.write_text(
        "\n".join(
            [
                good,
                "{not json",
                good,
                '{"timestamp": 1, "input_length": 600, "hash_ids": [0]}',
                '{"timestamp": 2, "input_length": -1, "output_length": 1}',
                '{"timestamp": "x", "input_length": 6, "output_length": 1}',
                good,
            ]
        )
        + "\n"
    )
    with pytest.raises(ImportFormatError, match=r"bad.jsonl:2: not a JSON object"):
        mooncake.read(src, ImportOptions())
    imported = mooncake.read(src, ImportOptions(skip_bad=True))
    assert len(imported) == 3 and imported.bad.count == 4
    assert "bad.jsonl:2: not a JSON object" in imported.bad.first  # lines 2, 4 (ids), 5 (negative), 6 (type)


def test_wrong_block_size_is_explained(tmp_path: Path) -> None:
    with pytest.raises(
        ImportFormatError, match=r":1: 14 hash_ids for input_length 6758, expected .* = 423 .*--block-size"
    ):
        mooncake.read(SAMPLE, ImportOptions(block_size=16))


def test_session_rows_with_delay(tmp_path: Path) -> None:
    src = tmp_path / "s.jsonl"
    src.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"session_id": "a", "timestamp": 1000, "input_length": 10, "output_length": 2},
                {"session_id": "a", "delay": 500, "input_length": 20, "output_length": 2},
                {"session_id": "b", "timestamp": 1200, "input_length": 10, "output_length": 2},
            ]
        )
    )
    cols = load(import_file(src, tmp_path / "s.rpt"))
    assert cols.offset_ns.tolist() == [0, 200_000_000, 500_000_000]
    assert cols.turn.tolist() == [0, 0, 1] and cols.session[0] == cols.session[2] != cols.session[1]
    # as AIPerf reads it: the later turn's 20 tokens are new, after the 10-token prompt and its reply
    assert cols.input_tokens.tolist() == [10, 10, 32] and cols.think_ns.tolist() == [-1, -1, 500_000_000]


def session_trace(tmp_path: Path) -> Path:
    """Turns at 0 / 10 / 20 s answered in 2 s (think 8 s), each prompt = previous + reply + 300 new."""
    shapes = []
    for turn in range(3):
        shapes.append(
            RequestShape(
                offset_ns=turn * 10 * S,
                input_tokens=1000 + turn * 350,
                output_tokens=50,
                e2e_ns=2 * S,
                session=77,
                turn=turn,
                think_ns=8 * S if turn else -1,
                status=200,
            )  # fmt: skip
        )
    shapes.append(RequestShape(offset_ns=5 * S, input_tokens=600, output_tokens=9))
    path = tmp_path / "sessions.rpt"
    header = TraceHeader(start_wall_ns=0, source="synth")
    write_trace(path, header, sorted(shapes, key=lambda s: s.offset_ns), mono_ns=lambda: 0, wall_ns=lambda: 0)
    return path


def test_session_export_holds_each_turns_new_part_and_delay_after_the_reply(tmp_path: Path) -> None:
    cols = load(session_trace(tmp_path))
    result = mooncake.write(cols, tmp_path / "m.jsonl", ExportOptions(sessions=True, block_size=64))
    rows = consumers.read_rows(tmp_path / "m.jsonl")
    assert [r.get("delay") for r in rows] == [None, None, 8000, 8000]
    assert [r["input_length"] for r in rows] == [1000, 600, 300, 300]  # 1350 - 1000 - 50 new
    assert [len(r["hash_ids"]) for r in rows] == [16, 10, 5, 5]
    assert consumers.aiperf_problems(rows, 64) == []
    assert any(n.startswith("AIPerf:") for n in result.notes)
    assert not any(n.startswith(("guidellm", "vLLM", "SGLang")) for n in result.notes)  # they cannot read it
    plain = mooncake.write(cols, tmp_path / "p.jsonl", ExportOptions(block_size=64))
    assert any(n.startswith("guidellm") for n in plain.notes)

    back = load(import_file(tmp_path / "m.jsonl", tmp_path / "back.rpt", block_size=64))
    assert back.input_tokens.tolist() == cols.input_tokens.tolist()  # the same whole prompts
    assert back.think_ns.tolist() == cols.think_ns.tolist()  # think times kept
    assert back.turn.tolist() == cols.turn.tolist() and len(set(back.session[back.turn >= 0].tolist())) == 2
    assert back.offset_ns.tolist()[:2] == [0, 5 * S]  # a first turn keeps its time


@pytest.mark.skipif(
    not (SHARED_TRACES / "conversation_trace.jsonl").exists(), reason="public traces not present"
)
def test_full_public_trace_round_trip(tmp_path: Path) -> None:
    src = SHARED_TRACES / "conversation_trace.jsonl"
    cols = load(import_file(src, tmp_path / "t.rpt"))
    assert len(cols) == 12031
    mooncake.write(cols, tmp_path / "m.jsonl", ExportOptions())
    assert consumers.all_problems(tmp_path / "m.jsonl", 512) == []
    original, exported = consumers.read_rows(src), consumers.read_rows(tmp_path / "m.jsonl")
    mapping: dict[int, int] = {}
    for a, b in zip(original, exported, strict=True):
        assert (a["timestamp"], a["input_length"], a["output_length"]) == (
            b["timestamp"],
            b["input_length"],
            b["output_length"],
        )
        full = a["input_length"] // 512
        for x, y in zip(a["hash_ids"][:full], b["hash_ids"][:full], strict=True):
            assert mapping.setdefault(x, y) == y
    assert len(set(mapping.values())) == len(mapping)  # full-block sharing is exactly the published one


AIPERF_PYTHON = os.environ.get("REPLAYPROXY_AIPERF_PYTHON", "")


@pytest.mark.skipif(
    not AIPERF_PYTHON, reason="opt-in: REPLAYPROXY_AIPERF_PYTHON=<python with aiperf installed>"
)
@pytest.mark.parametrize("block", [512, 16])
def test_aiperf_own_loader_accepts_the_export(tmp_path: Path, block: int) -> None:
    check = Path(__file__).with_name("aiperf_check.py")
    cols = load(import_file(SAMPLE, tmp_path / "t.rpt"))
    mooncake.write(cols, tmp_path / "m.jsonl", ExportOptions(block_size=block))
    run = subprocess.run(
        [AIPERF_PYTHON, str(check), str(tmp_path / "m.jsonl"), str(block)], capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok 300", run.stdout + run.stderr
    bad = tmp_path / "bad.jsonl"  # an id used as a partial and as a full block: AIPerf must refuse it
    bad.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}\n'
        '{"timestamp": 1, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]}\n'
    )
    run = subprocess.run([AIPERF_PYTHON, str(check), str(bad), "512"], capture_output=True, text=True)
    assert run.returncode == 1 and "already materialized" in run.stdout


@pytest.mark.skipif(
    not AIPERF_PYTHON, reason="opt-in: REPLAYPROXY_AIPERF_PYTHON=<python with aiperf installed>"
)
def test_aiperf_multi_turn_reading_sends_the_traces_input_lengths(tmp_path: Path) -> None:
    """AIPerf's own session accumulation over a --sessions export: every turn carries exactly the
    trace's input length (the earlier turns, their replies and the new part), not more."""
    check = Path(__file__).with_name("aiperf_multiturn_check.py")
    cols = load(session_trace(tmp_path))
    mooncake.write(cols, tmp_path / "m.jsonl", ExportOptions(sessions=True, block_size=64))
    run = subprocess.run(
        [AIPERF_PYTHON, str(check), str(tmp_path / "m.jsonl")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout) == cols.input_tokens.tolist()
    inflated = tmp_path / "whole.jsonl"  # whole conversations per row, as the export wrote them before
    inflated.write_text(
        "".join(
            json.dumps({"session_id": "s0", "delay": 0, "input_length": n, "output_length": 50}) + "\n"
            for n in cols.input_tokens[cols.session != 0].tolist()
        )
    )
    run = subprocess.run([AIPERF_PYTHON, str(check), str(inflated)], capture_output=True, text=True)
    assert sum(json.loads(run.stdout)) > cols.input_tokens[cols.session != 0].sum()  # the check can fail


def test_timestamps_keep_sub_millisecond_precision(tmp_path: Path) -> None:
    # 1,000 req/s with jitter: whole milliseconds would merge many neighbours into one instant.
    offsets_ms = np.cumsum(np.random.default_rng(1).exponential(1.0, 300))
    trace = write(tmp_path / "t.rpt", [shape(float(t), tokens(("p", 40)), 3) for t in offsets_ms])
    mooncake.write(load(trace), tmp_path / "m.jsonl", ExportOptions(block_size=16))
    stamps = np.array([r["timestamp"] for r in consumers.read_rows(tmp_path / "m.jsonl")])
    assert np.abs(stamps - (offsets_ms - offsets_ms[0])).max() < 0.001
    assert (np.diff(stamps) == 0).sum() == 0
    back = load(import_file(tmp_path / "m.jsonl", tmp_path / "b.rpt", block_size=16))
    source = load(trace).offset_ns
    assert np.abs(back.offset_ns - (source - source[0])).max() <= 1000  # ns: microseconds kept


def test_sglang_reader_gets_the_recorded_lengths_and_sharing_from_128_token_ids(tmp_path: Path) -> None:
    """SGLang builds each prompt from hash_ids alone, 128 "hi" per id: only a 128-token export gives
    prompts of the recorded length (within one chunk), and shared ids give shared prompt text."""
    cols = load(conversation_trace(tmp_path / "t.rpt"))
    out = tmp_path / "m.jsonl"
    result = mooncake.write(cols, out, ExportOptions(block_size=128, url="http://h:30000", model="m"))
    (command,) = [n for n in result.notes if n.startswith("SGLang:")]
    assert f"--dataset-path {out} --num-prompts 6 " in command and "--base-url http://h:30000" in command
    requests = consumers.sglang_requests(consumers.read_rows(out), num_prompts=6)
    assert [arrival for arrival, _, _ in requests] == [0, 0.25, 0.9, 1.5, 1.5, 3.001]
    recorded = cols.input_tokens.tolist()
    chunk = " ".join(["hi"] * 128)
    for (_, prompt, output), n_in, n_out in zip(requests, recorded, cols.output_tokens.tolist(), strict=True):
        chunks = prompt.count(chunk)  # one 128-token chunk per id
        assert n_in <= chunks * 128 < n_in + 128 and output == n_out
    # the first two requests share a 1024-token system prompt: 8 chunks of identical text
    common = os.path.commonprefix([requests[0][1], requests[1][1]])
    assert common.count(chunk) == 1024 // 128
    # the default 512-token ids would give prompts a quarter of the length: the export says so
    default = mooncake.write(cols, tmp_path / "d.jsonl", ExportOptions())
    (note,) = [n for n in default.notes if n.startswith("SGLang:")]
    assert "needs --block-size 128" in note and "bench_serving" not in note
