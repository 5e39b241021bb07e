"""AIPerf DAG export: a session graph as conversations with forks and spawns, read back edge by edge."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from replayproxy import cli
from replayproxy.formats import aiperf_dag
from replayproxy.formats.exporting import ExportOptions
from replayproxy.shape import RequestShape
from replayproxy.trace import Columns, TraceHeader, load, write_trace

MS = 1_000_000
AIPERF_PYTHON = os.environ.get("REPLAYPROXY_AIPERF_PYTHON", "")


def agent_trace(path: Path) -> Path:
    """Session 1: root R; A continues R; B continues R and nobody joins it (a fork); C continues R
    and J joins it; sub-agent S (spawned by A, two calls S, S2); J continues A and joins C and S2.
    Session 2: one request whose parent was not recorded. Output tokens 100 + row name each row."""

    def shape(row: int, chat: int, parent: int = 0, session: int = 1, **more: Any) -> RequestShape:
        return RequestShape(
            offset_ns=row * 100 * MS,
            input_tokens=[100, 300, 260, 280, 50, 120, 900, 40][row],
            output_tokens=100 + row,
            session=session,
            chat_id=chat,
            parent_id=parent,
            think_ns=5 * MS * row if parent else -1,
            **more,
        )

    shapes = [
        shape(0, 10),
        shape(1, 11, 10),
        shape(2, 12, 10),
        shape(3, 13, 10),
        shape(4, 14, 11, spawned=True),
        shape(5, 15, 14),
        shape(6, 16, 11, join_ids=(13, 15)),
        shape(7, 17, 999, session=2),
    ]
    clock = count(1)
    write_trace(path, TraceHeader(start_wall_ns=1), shapes, mono_ns=lambda: next(clock), wall_ns=lambda: 1)
    return path


def words(cols: Columns) -> Iterator[str]:
    """A stand-in for the replayer's prompts: one word per input token."""
    for n in cols.input_tokens.tolist():
        yield " ".join(["w"] * int(n))


def read_back(lines: list[dict[str, Any]]) -> dict[int, tuple[int, list[int], int]]:
    """Per trace row (from max_tokens - 100): its parent row, the rows it joins, and the tokens the
    request carries under AIPerf's default context mode (earlier turns' messages, no replies)."""
    by_id = {line["session_id"]: line for line in lines}
    out: dict[int, tuple[int, list[int], int]] = {}

    def walk(line: dict[str, Any], parent: int, held: int) -> None:
        rows = [t["max_tokens"] - 100 for t in line["turns"]]
        joins: dict[int, list[int]] = {}
        for k, turn in enumerate(line["turns"]):
            held += len(turn["messages"][0]["content"].split(" "))
            out[rows[k]] = (rows[k - 1] if k else parent, joins.get(k, []), held)
            for fork in turn.get("forks", []):
                walk(by_id[fork["child"]], rows[k], held)
            for spawn in turn.get("spawns", []):
                for child in spawn["children"]:
                    walk(by_id[child], rows[k], 0)
                    last = by_id[child]["turns"][-1]["max_tokens"] - 100
                    joins.setdefault(spawn["join_at"], []).append(last)

    children = {f["child"] for x in lines for t in x["turns"] for f in t.get("forks", [])}
    children |= {c for x in lines for t in x["turns"] for s in t.get("spawns", []) for c in s["children"]}
    for line in lines:
        if line["session_id"] not in children:
            walk(line, -1, 0)
    return out


def test_the_graph_round_trips_through_forks_and_spawns(tmp_path: Path) -> None:
    cols = load(agent_trace(tmp_path / "t.rpt"))
    out = tmp_path / "dag.jsonl"
    result = aiperf_dag.write(cols, out, ExportOptions(prompts=words))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert result.rows == 8 and len(lines) == 5  # R-A-J, B, C, S-S2, the orphan
    got = read_back(lines)
    assert sorted(got) == list(range(8))
    parents = {row: p for row, (p, _, _) in got.items()}
    assert parents == {0: -1, 1: 0, 2: 0, 3: 0, 4: 1, 5: 4, 6: 1, 7: -1}
    assert {row: j for row, (_, j, _) in got.items() if j} == {6: [3, 5]}
    # every request carries its recorded input length: a fork inherits its parent's context,
    # a spawn starts fresh, a joined branch that continued its parent's context carries all of it
    assert {row: tokens for row, (_, _, tokens) in got.items()} == dict(enumerate(cols.input_tokens.tolist()))
    fork = next(t for x in lines for t in x["turns"] if "forks" in t)
    assert fork["forks"] == [{"child": lines[1]["session_id"], "background": True}]
    assert len(fork["messages"][0]["content"].split(" ")) == 100
    root = lines[0]["turns"]
    assert root[0]["delay"] == 0.0 and root[1]["delay"] == 5.0 and root[2]["delay"] == 30.0
    assert [s["join_at"] for t in root for s in t.get("spawns", [])] == [2, 2]
    notes = "\n".join(result.notes)
    assert "1 joined branches that continue their parent's context became spawns" in notes
    assert "1 dependencies have no place" in notes  # the orphan's parent was never recorded


def test_a_spawn_nobody_joins_and_a_join_across_conversations_are_counted(tmp_path: Path) -> None:
    shapes = [
        RequestShape(offset_ns=0, input_tokens=10, output_tokens=1, session=1, chat_id=1),
        RequestShape(
            offset_ns=MS, input_tokens=10, output_tokens=2, session=1, chat_id=2, parent_id=1, spawned=True
        ),
        RequestShape(offset_ns=2 * MS, input_tokens=30, output_tokens=3, session=1, chat_id=3, parent_id=1),
        RequestShape(offset_ns=3 * MS, input_tokens=20, output_tokens=4, session=1, chat_id=4, parent_id=1),
        # continues the fork-free branch 4 but joins 3, which is not in its conversation nor a spawn
        RequestShape(
            offset_ns=4 * MS,
            input_tokens=40,
            output_tokens=5,
            session=1,
            chat_id=5,
            parent_id=4,
            join_ids=(3,),
        ),
    ]
    clock = count(1)
    path = tmp_path / "t.rpt"
    write_trace(path, TraceHeader(start_wall_ns=1), shapes, mono_ns=lambda: next(clock), wall_ns=lambda: 1)
    dag = aiperf_dag.plan(load(path))
    # row 1: a spawn that nothing joins is a root of its own (1 dropped); row 2 continues row 0;
    # row 3 is a fork of row 0 carrying row 4; row 4's join of row 2 has no place (1 dropped)
    assert [c.rows for c in dag.conversations] == [[0, 2], [1], [3, 4]]
    assert dag.forks == {0: [2]} and dag.spawns == {} and dag.dropped == 2


def test_export_command_writes_it_with_the_replayers_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = agent_trace(tmp_path / "t.rpt")
    out = tmp_path / "dag.jsonl"
    assert cli.main(["export", str(trace), "--format", "aiperf-dag", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "--custom-dataset-type dag_jsonl" in printed and "5 AIPerf conversations (2 roots" in printed
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(read_back(lines)) == list(range(8))
    assert all(t["messages"][0]["content"].strip() for x in lines for t in x["turns"])


@pytest.mark.skipif(
    not AIPERF_PYTHON, reason="opt-in: REPLAYPROXY_AIPERF_PYTHON=<python with aiperf installed>"
)
def test_aiperf_own_dag_loader_accepts_the_export(tmp_path: Path) -> None:
    cols = load(agent_trace(tmp_path / "t.rpt"))
    out = tmp_path / "dag.jsonl"
    aiperf_dag.write(cols, out, ExportOptions(prompts=words))
    check = Path(__file__).with_name("aiperf_dag_check.py")
    run = subprocess.run([AIPERF_PYTHON, str(check), str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == {"conversations": 5, "roots": 2, "turns": 8}
    bad = tmp_path / "bad.jsonl"  # a join past the parent's last turn: AIPerf must refuse it
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    next(t for t in lines[0]["turns"] if "spawns" in t)["spawns"][0]["join_at"] = 9
    bad.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = subprocess.run([AIPERF_PYTHON, str(check), str(bad)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "join_at" in run.stdout, run.stdout
