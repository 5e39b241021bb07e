"""Agent-session imports (Copilot, WEKA, Dynamo, agentic Mooncake): the graph each source describes.

Fixtures are written from the published specs (docs/formats.md cites each): field names and units
as the spec gives them, values small enough to check by hand.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replayproxy import cli
from replayproxy.formats import agentic_mooncake, copilot, dynamo, weka
from replayproxy.formats.importing import Imported, ImportFormatError, ImportOptions, Ragged, write_imported
from replayproxy.trace import Columns, load


def written(imported: Imported, path: Path) -> Columns:
    write_imported(imported, path, lambda: 0)
    return load(path)


def lines(path: Path, rows: list[Any], gz: bool = False) -> Path:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def parents(cols: Columns) -> list[int]:
    """Each request's parent as a row index (-1: a root), through chat_id / parent_id."""
    rows = {int(c): i for i, c in enumerate(cols.chat_id.tolist())}
    return [rows.get(int(p), -1) if p else -1 for p in cols.parent_id.tolist()]


def joins(imported: Imported) -> list[list[int]]:
    """Join ids per request in the reader's order, as indices into its chat ids."""
    ragged: Ragged = imported.columns["join_ids"]
    chats = {int(c): i for i, c in enumerate(np.asarray(imported.columns["chat_id"]).tolist())}
    flat, out, at = ragged.flat.tolist(), [], 0
    for n in ragged.counts.tolist():
        out.append([chats[int(c)] for c in flat[at : at + n]])
        at += n
    return out


def shared_blocks(cols: Columns, a: int, b: int) -> int:
    x, y = cols.hashes_of(a), cols.hashes_of(b)
    n = min(len(x), len(y))
    return next((i for i in range(n) if x[i] != y[i]), n)


# --------------------------------------------------------------------------- Copilot


def llm_call(
    message: str, ts: str, ms: float, prompt: int, out: int, cached: int, **more: Any
) -> dict[str, Any]:
    tokens = {"total": prompt + out, "prompt": prompt, "completion": out, "cached": cached, "cached_pct": 0.0}
    return {
        "message_id": message,
        "timestamp": ts,
        "duration_ms": ms,
        "initiator_type": "agent",
        "model": "Model A",
        "result": "Success",
        "status_code": "OK",
        "tokens": tokens,
        "message_metadata": [{"type": "System", "role": "system", "sequenceId": 0, "token_len": 100}],
        **more,
    }


def tool_batch(request: str, ts: str, ms: float, calls: int) -> dict[str, Any]:
    return {
        "timestamp": ts,
        "duration_ms": ms,
        "auto_continue": True,
        "result": "Success",
        "request_id": request,
        "function_calls": [{"name": "read_file", "status": 1, "duration_ms": ms / 2}] * calls,
    }


def copilot_session() -> dict[str, Any]:
    """Turn 1: a call, a batch of 3 parallel tools, the next call (1024 of its 1300 tokens cached);
    two calls that overlap (the second starts before the first ends: a branch); turn 2 (the user)."""
    return {
        "session_id": "a1b2",
        "date": "2026-06-01",
        "turns": [
            {
                "turn_id": "t1",
                "llm_calls": [
                    llm_call("m1", "2026-06-01T10:00:00Z", 2000, 1000, 100, 0, initiator_type="user"),
                    llm_call("m2", "2026-06-01T10:00:03.5Z", 1000, 1300, 50, 1024),
                    llm_call("m3", "2026-06-01T10:00:05Z", 3000, 1400, 40, 1280),
                    llm_call("m4", "2026-06-01T10:00:06Z", 500, 1400, 20, 1280),
                ],
                "tool_batches": [tool_batch("m1", "2026-06-01T10:00:02.2Z", 1200, 3)],
            },
            {
                "turn_id": "t2",
                "llm_calls": [
                    llm_call("m5", "2026-06-01T10:01:00Z", 1000, 2000, 10, 1280, initiator_type="user")
                ],
                "tool_batches": [],
            },
        ],
    }


def test_copilot_session_becomes_a_graph_with_tool_waits_and_cached_prefixes(tmp_path: Path) -> None:
    src = lines(tmp_path / "shard-0000.jsonl.gz", [copilot_session()], gz=True)
    imported = copilot.read(src, ImportOptions())
    cols = written(imported, tmp_path / "c.rpt")
    assert cols.offset_ns.tolist() == [0, 3_500_000_000, 5_000_000_000, 6_000_000_000, 60_000_000_000]
    assert cols.input_tokens.tolist() == [1000, 1300, 1400, 1400, 2000]
    assert cols.cached_tokens.tolist() == [0, 1024, 1280, 1280, 1280]
    assert cols.e2e_ns.tolist() == [2e9, 1e9, 3e9, 0.5e9, 1e9]
    assert len(set(cols.session.tolist())) == 1 and cols.session[0] != 0
    # m3 and m4 both continue m2 (m3 still runs when m4 starts); m5 continues m3, the latest to end
    assert parents(cols) == [-1, 0, 1, 1, 2]
    assert cols.turn.tolist() == [0, 1, 2, 2, 3]
    # the tool wait: from m1's end (2 s) to m2's start (3.5 s); m5 waits from m3's end (8 s)
    assert cols.think_ns.tolist() == [-1, 1_500_000_000, 500_000_000, 1_500_000_000, 52_000_000_000]
    # cached tokens shared with the parent, in 64-token blocks: 1024 // 64 = 16 of m2's blocks
    assert shared_blocks(cols, 0, 1) == 15  # m1 has only 1000 // 64 = 15 full blocks
    assert shared_blocks(cols, 1, 2) == 20 and shared_blocks(cols, 1, 3) == 20
    assert imported.extra["tool_calls"] == 3 and imported.extra["parallel_tool_batches"] == 1
    assert imported.extra["graph_branches"] == 1 and cols.headers[0].start_wall_ns == 1_780_308_000 * 10**9


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: s["turns"][0]["llm_calls"][1]["tokens"].update(cached=2000), "tokens.cached 2000 is more"),
        (lambda s: s["turns"][0]["llm_calls"][1]["tokens"].update(prompt=-1), "tokens.prompt is -1"),
        (
            lambda s: s["turns"][0]["llm_calls"][1].update(timestamp="yesterday"),
            "timestamp 'yesterday' is not an ISO-8601",
        ),
        (lambda s: s["turns"][0]["llm_calls"][1].update(duration_ms=True), "duration_ms True"),
        (lambda s: s.update(turns={"t": 1}), "turns is not a list"),
        (
            lambda s: s["turns"][0]["tool_batches"][0].update(function_calls="x"),
            "function_calls is not a list",
        ),
    ],
)
def test_copilot_refuses_damaged_sessions_in_one_line(tmp_path: Path, change: Any, reason: str) -> None:
    bad = copilot_session()
    change(bad)
    src = lines(tmp_path / "s.jsonl", [copilot_session(), bad])
    with pytest.raises(ImportFormatError, match=rf"s.jsonl:2: {reason}"):
        copilot.read(src, ImportOptions())
    assert len(copilot.read(src, ImportOptions(skip_bad=True))) == 5


# --------------------------------------------------------------------------- WEKA


def weka_request(t: float, n_in: int, ids: list[int], **more: Any) -> dict[str, Any]:
    return {
        "t": t,
        "type": "s",
        "model": "claude-sonnet-4",
        "in": n_in,
        "out": 100,
        "hash_ids": ids,
        "input_types": ["text"],
        "output_types": ["text"],
        "stop": "tool_use",
        **more,
    }


def weka_trace(trace_id: str) -> dict[str, Any]:
    """Two parent requests, then two sub-agents spawned at 12 s, then the parent's next request."""
    sub = {
        "type": "subagent",
        "agent_id": "96624242",
        "subagent_type": "Explore",
        "duration_ms": 9000,
        "total_tokens": 500,
        "tool_use_count": 2,
        "status": "completed",
        "models": ["claude-haiku"],
        "tool_tokens": 0,
        "system_tokens": 0,
        "requests": [
            weka_request(0.0, 128, [1, 50], api_time=2.0),
            weka_request(3.0, 192, [1, 50, 51], api_time=2.0, think_time=1.0),
        ],
    }
    return {
        "id": trace_id,
        "models": ["claude-sonnet-4"],
        "block_size": 64,
        "hash_id_scope": "local",
        "tool_tokens": 0,
        "system_tokens": 0,
        "requests": [
            weka_request(0.0, 192, [1, 2, 3], api_time=4.0, ttft=1.0),
            weka_request(10.0, 256, [1, 2, 3, 4], api_time=2.0, think_time=6.0),
            {**sub, "t": 12.5},
            {**sub, "t": 12.6, "agent_id": "b"},
            weka_request(30.0, 320, [1, 2, 3, 4, 5], api_time=1.0, think_time=12.0),
        ],
    }


def test_weka_subagents_are_spawned_branches_joined_by_the_next_parent_request(tmp_path: Path) -> None:
    src = tmp_path / "traces"
    src.mkdir()
    (src / "a.json").write_text(json.dumps(weka_trace("8712b46f-04e")))
    (src / "b.json").write_text(json.dumps(weka_trace("f99f3001-351")))
    imported = weka.read(src, ImportOptions())
    spawned = np.asarray(imported.columns["spawned"]).tolist()
    cols = written(imported, tmp_path / "w.rpt")
    n = 7  # requests per trace: 3 of the parent, 2 per sub-agent
    assert len(cols) == 2 * n and len(set(cols.session.tolist())) == 2
    first = [i for i in range(len(cols)) if cols.session[i] == cols.session[0]]
    offsets = sorted(cols.offset_ns[first].tolist())
    assert offsets == [0, 10e9, 12.5e9, 12.6e9, 15.5e9, 15.6e9, 30e9]  # every trace starts at 0
    # in the reader's order: parent 0, parent 1, sub A (2, 3), sub B (4, 5), parent 6
    assert spawned[:n] == [False, False, True, False, True, False, False]
    assert joins(imported)[:n] == [[], [], [], [], [], [], [3, 5]]
    got = np.asarray(imported.columns["think_ns"])[:n].tolist()
    # the parent's own think times are kept; the joining request's wait is measured from the
    # last-ending sub-agent request (15.6 + 2 s) to its arrival (30 s)
    assert got[1] == 6e9 and got[3] == 1e9 and got[6] == 30e9 - 17.6e9
    assert np.asarray(imported.columns["turn"])[:n].tolist() == [0, 1, 2, 3, 2, 3, 4]
    # hash ids are per trace: trace b's id 1 is not trace a's id 1, but within a trace the
    # sub-agent's block 1 is the parent's block 1 (the shared tools + system prefix)
    a, b = first[0], next(i for i in range(len(cols)) if i not in first)
    assert shared_blocks(cols, a, b) == 0
    sub_a = first[offsets.index(12.5e9)]
    assert shared_blocks(cols, first[0], sub_a) == 1
    assert cols.e2e_ns[a] == 4e9 and cols.ttft_ns[a] == 1e9 and cols.model[a] == "claude-sonnet-4"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda t: t.update(hash_id_scope="global"), "hash_id_scope 'global'"),
        (lambda t: t.update(block_size=0), "block_size 0"),
        (lambda t: t["requests"][0].update(hash_ids=[1, -2]), "hash_ids is not a list of integers"),
        (lambda t: t["requests"][0].update({"in": 2**40}), "in is 1099511627776"),
        (lambda t: t["requests"][0].update(t="soon"), "t is 'soon'"),
        (lambda t: t["requests"][0].update(type="x"), "type 'x'"),
    ],
)
def test_weka_refuses_damaged_traces_in_one_line(tmp_path: Path, change: Any, reason: str) -> None:
    trace = weka_trace("x")
    change(trace)
    (tmp_path / "bad.json").write_text(json.dumps(trace))
    (tmp_path / "good.json").write_text(json.dumps(weka_trace("y")))
    with pytest.raises(ImportFormatError, match=rf"bad.json: {reason}"):
        weka.read(tmp_path, ImportOptions())
    assert len(weka.read(tmp_path, ImportOptions(skip_bad=True))) == 7


def test_weka_nesting_is_bounded(tmp_path: Path) -> None:
    trace: dict[str, Any] = weka_trace("deep")
    inner: dict[str, Any] = trace
    for _ in range(weka.MAX_NESTING + 2):
        sub = {"type": "subagent", "t": 1.0, "status": "completed", "requests": []}
        inner["requests"].append(sub)
        inner = sub
    (tmp_path / "d.json").write_text(json.dumps(trace))
    with pytest.raises(ImportFormatError, match="nested deeper than 8"):
        weka.read(tmp_path / "d.json", ImportOptions())


# --------------------------------------------------------------------------- Dynamo


def dynamo_row(
    rid: str, received: int, total: float, n_in: int, hashes: list[int], **context: str
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "schema": "dynamo.request.trace.v1",
        "event_type": "request_end",
        "event_time_unix_ms": received + total,
        "event_source": "dynamo",
        "request": {
            "request_id": rid,
            "model": "m",
            "input_tokens": n_in,
            "output_tokens": 8,
            "request_received_ms": received,
            "total_time_ms": total,
            "ttft_ms": 10.0,
            "replay": {"trace_block_size": 64, "input_length": n_in, "input_sequence_hashes": hashes},
        },
    }
    if context:
        row["agent_context"] = context
    return row


def test_dynamo_chains_and_child_sessions_become_one_graph(tmp_path: Path) -> None:
    t0 = 1_780_000_000_000
    big = 2**64 - 5  # sequence hashes are unsigned 64-bit
    rows = [
        dynamo_row("r1", t0, 1000, 128, [big, 7], session_id="run", trajectory_id="run:planner"),
        {"schema": "dynamo.request.trace.v1", "event_type": "tool_end", "event_time_unix_ms": t0 + 1500},
        dynamo_row(
            "c1",
            t0 + 1200,
            500,
            64,
            [9],
            session_id="run",
            trajectory_id="run:w1",
            parent_trajectory_id="run:planner",
        ),
        dynamo_row(
            "c2",
            t0 + 1800,
            500,
            64,
            [9],
            session_id="run",
            trajectory_id="run:w1",
            parent_trajectory_id="run:planner",
        ),
        dynamo_row("r2", t0 + 3000, 800, 192, [big, 7, 8], session_id="run", trajectory_id="run:planner"),
        dynamo_row("lone", t0 + 100, 50, 64, [big]),
    ]
    imported = dynamo.read(lines(tmp_path / "request-trace.000000.jsonl.gz", rows, gz=True), ImportOptions())
    cols = written(imported, tmp_path / "d.rpt")
    assert cols.offset_ns.tolist() == [0, 100e6, 1200e6, 1800e6, 3000e6]
    assert parents(cols) == [-1, -1, 0, 2, 0]
    assert cols.session[0] == cols.session[2] == cols.session[4] != cols.session[1]
    assert imported.extra["other_records"] == 1
    assert shared_blocks(cols, 0, 4) == 2 and shared_blocks(cols, 0, 1) == 1  # global hashes
    # reader order is file order: r1, c1, c2, r2, lone; r2 joins the child's last request (c2)
    assert joins(imported) == [[], [], [], [2], []]
    assert np.asarray(imported.columns["spawned"]).tolist() == [False, True, False, False, False]
    # r2's wait counts from the later of r1's end (1 s) and c2's end (2.3 s)
    assert cols.think_ns[4] == 700e6 and cols.e2e_ns[0] == 1e9


def test_dynamo_refuses_mixed_block_sizes_and_damaged_rows(tmp_path: Path) -> None:
    good = dynamo_row("a", 1_000, 10, 64, [1])
    odd = dynamo_row("b", 2_000, 10, 64, [1])
    odd["request"]["replay"]["trace_block_size"] = 16
    with pytest.raises(ImportFormatError, match=r"d.jsonl:2: trace_block_size 16 differs from 64"):
        dynamo.read(lines(tmp_path / "d.jsonl", [good, odd]), ImportOptions())
    damaged = dynamo_row("c", 2_000, 10, 64, [1, 2, 3, 4])
    with pytest.raises(ImportFormatError, match=r"at most 2 hashes"):
        dynamo.read(lines(tmp_path / "d.jsonl", [good, damaged]), ImportOptions())
    damaged = dynamo_row("c", 2_000, 10, 64, [-1])
    with pytest.raises(ImportFormatError, match=r"unsigned 64-bit"):
        dynamo.read(lines(tmp_path / "d.jsonl", [good, damaged]), ImportOptions())


# --------------------------------------------------------------------------- agentic Mooncake


def mooncake_rows() -> list[dict[str, Any]]:
    """Root a, branch b1 continuing it, sub-agent b2 spawned by it (its own prefix), join j of both."""
    return [
        {
            "request_id": "a",
            "session_id": "s",
            "timestamp": 1000,
            "input_length": 1024,
            "output_length": 10,
            "hash_ids": [1, 2],
        },
        {
            "request_id": "b1",
            "session_id": "s",
            "timestamp": 2000,
            "input_length": 1536,
            "output_length": 10,
            "hash_ids": [1, 2, 3],
            "wait_for": ["a"],
            "tool_wait_ms": 250.0,
        },
        {
            "request_id": "b2",
            "session_id": "s",
            "timestamp": 2000,
            "input_length": 512,
            "output_length": 10,
            "hash_ids": [9],
            "wait_for": ["a"],
            "prefix_reset": True,
            "delay": 5,
        },
        {
            "request_id": "j",
            "session_id": "s",
            "input_length": 2048,
            "output_length": 10,
            "hash_ids": [1, 2, 3, 4],
            "wait_for": ["b1", "b2"],
            "delay": 100,
            "tool_wait_ms": 50,
        },
    ]


def test_agentic_mooncake_wait_for_gives_parents_joins_and_waits(tmp_path: Path) -> None:
    rows = mooncake_rows()
    imported = agentic_mooncake.read(lines(tmp_path / "am.jsonl", rows), ImportOptions())
    cols = written(imported, tmp_path / "am.rpt")
    # j has no timestamp: placed at its latest dependency's arrival plus its wait, a lower bound
    assert cols.offset_ns.tolist() == [0, 1000e6, 1000e6, 1150e6]
    assert parents(cols) == [-1, 0, 0, 2]
    assert joins(imported) == [[], [], [], [1]]
    assert np.asarray(imported.columns["spawned"]).tolist() == [False, False, True, False]
    assert cols.think_ns.tolist() == [-1, 250e6, 5e6, 150e6] and cols.turn.tolist() == [0, 1, 1, 2]
    assert shared_blocks(cols, 0, 1) == 2 and shared_blocks(cols, 1, 3) == 3


def test_agentic_mooncake_refuses_unknown_dependencies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"request_id": "a", "timestamp": 0, "input_length": 10, "wait_for": ["later"]}]
    src = lines(tmp_path / "am.jsonl", rows)
    code = cli.main(["import", str(src), "--format", "agentic-mooncake", "-o", str(tmp_path / "o.rpt")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "am.jsonl:1: wait_for names 'later'" in err


# --------------------------------------------------------------------------- the graph in the file


def graph_of(cols: Columns) -> tuple[list[int], list[list[int]], list[bool], list[int]]:
    """Parents and joins as row indices, spawned flags and depths, read back from a trace file."""
    rows = {int(c): i for i, c in enumerate(cols.chat_id.tolist())}
    joined = [sorted(rows[int(j)] for j in cols.joins_of(i)) for i in range(len(cols))]
    return parents(cols), joined, cols.spawned.astype(bool).tolist(), cols.turn.tolist()


def weka_source(tmp_path: Path) -> Path:
    src = tmp_path / "weka"
    src.mkdir()
    (src / "a.json").write_text(json.dumps(weka_trace("8712b46f-04e")))
    return src


def dynamo_source(tmp_path: Path) -> Path:
    t0 = 1_780_000_000_000
    planner = {"session_id": "run", "trajectory_id": "run:planner"}
    worker = {**planner, "trajectory_id": "run:w1", "parent_trajectory_id": "run:planner"}
    rows = [
        dynamo_row("r1", t0, 1000, 128, [5, 7], **planner),
        dynamo_row("c1", t0 + 1200, 500, 64, [9], **worker),
        dynamo_row("c2", t0 + 1800, 500, 64, [9], **worker),
        dynamo_row("r2", t0 + 3000, 800, 192, [5, 7, 8], **planner),
    ]
    return lines(tmp_path / "request-trace.000000.jsonl", rows)


def mooncake_source(tmp_path: Path) -> Path:
    base = {"session_id": "s", "output_length": 10}
    rows = [
        {**base, "request_id": "a", "timestamp": 1000, "input_length": 1024, "hash_ids": [1, 2]},
        {
            **base,
            "request_id": "b1",
            "timestamp": 2000,
            "input_length": 1536,
            "hash_ids": [1, 2, 3],
            "wait_for": ["a"],
        },
        {
            **base,
            "request_id": "b2",
            "timestamp": 2000,
            "input_length": 512,
            "hash_ids": [9],
            "wait_for": ["a"],
            "prefix_reset": True,
        },
        {
            **base,
            "request_id": "j",
            "timestamp": 3000,
            "input_length": 2048,
            "hash_ids": [1, 2, 3, 4],
            "wait_for": ["b1", "b2"],
        },
    ]
    return lines(tmp_path / "am.jsonl", rows)


@pytest.mark.parametrize(
    ("fmt", "source", "graph"),
    [
        # m1 -> m2 -> (m3, m4 branches) ; m5 continues m3: no joins, nothing spawned
        ("copilot", lambda p: lines(p / "s.jsonl", [copilot_session()]), None),
        # in arrival order: parent 0 (0 s), parent 1 (10 s), sub A (12.5 s), sub B (12.6 s), their
        # second requests (15.5 s, 15.6 s), the parent's request at 30 s joining both sub-agents
        (
            "weka",
            weka_source,
            (
                [-1, 0, 1, 1, 2, 3, 1],
                [[], [], [], [], [], [], [4, 5]],
                [False, False, True, True] + [False] * 3,
            ),
        ),
        (
            "dynamo",
            dynamo_source,
            ([-1, 0, 1, 0], [[], [], [], [2]], [False, True, False, False]),
        ),
        (
            "agentic-mooncake",
            mooncake_source,
            ([-1, 0, 0, 2], [[], [], [], [1]], [False, False, True, False]),
        ),
    ],
)
def test_imported_graph_survives_the_trace_file(tmp_path: Path, fmt: str, source: Any, graph: Any) -> None:
    """`replayproxy import` writes join_ids and spawned: the file read back has the reader's graph,
    and each request's depth is the longest path to it along parents and joins."""
    out = tmp_path / "o.rpt"
    assert cli.main(["import", str(source(tmp_path)), "--format", fmt, "-o", str(out)]) == 0
    cols = load(out)
    got_parents, got_joins, got_spawned, depth = graph_of(cols)
    if graph is not None:
        assert (got_parents, got_joins, got_spawned) == graph
    else:
        assert got_parents == [-1, 0, 1, 1, 2] and not any(got_joins) and not any(got_spawned)
    for row in range(len(cols)):  # turn = longest path from a root, over every dependency
        deps = [got_parents[row], *got_joins[row]]
        expected = max((depth[d] + 1 for d in deps if d >= 0), default=0)
        assert depth[row] == expected, (fmt, row)
