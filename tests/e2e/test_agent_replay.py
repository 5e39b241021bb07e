"""Agent sessions recorded through the proxy, replayed closed loop against a slower sim: branches
of one turn go out together, and no request is sent before the replies it waits for ended (every
edge of the recorded graph checked in the result file)."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from replayproxy import trace
from replayproxy.cli import main
from tests.agents import MODEL, AgentClient, random_sessions
from tests.e2e.test_replay_sim import replay
from tests.formats.test_agent_imports import lines, mooncake_rows, weka_trace
from tests.servers import sim, start_proxy

pytestmark = pytest.mark.slow


def edges(columns: trace.Columns) -> list[tuple[int, int]]:
    """(dependency row, dependent row) for every parent and join link among the trace's rows."""
    row_of = {int(c): i for i, c in enumerate(columns.chat_id.tolist()) if c}
    out = []
    for row in range(len(columns)):
        deps = [int(columns.parent_id[row]), *map(int, columns.joins_of(row))]
        out += [(row_of[d], row) for d in deps if d in row_of]
    return out


def violated(columns: trace.Columns, result_index: np.ndarray, sent: np.ndarray, end: np.ndarray) -> int:
    at = {int(i): k for k, i in enumerate(result_index.tolist())}
    return sum(1 for dep, row in edges(columns) if sent[at[row]] < end[at[dep]])


def test_a_replayed_agent_graph_keeps_every_edge_and_runs_branches_in_parallel(tmp_path: Path) -> None:
    sessions = random_sessions(random.Random(7), 5, max_fan_out=6, max_depth=3)
    with sim("--speed", "10") as engine, start_proxy(engine.url, tmp_path / "traces") as proxy:
        asyncio.run(AgentClient(proxy.url).run(sessions))
        assert proxy.stop() == 0
    paths = sorted((tmp_path / "traces").glob("*.rpt"))
    columns = trace.load(paths)
    assert sum(1 for _ in edges(columns)) > len(columns) - len(sessions)  # joins add edges
    with sim("--speed", "5") as slower:  # the candidate answers at half production's speed
        result = replay(paths[0], slower.url, tmp_path / "r.rpr", "--no-calibrate", "--sessions", "closed")
    index, sent, e2e = (result.column(c) for c in ("index", "sent_ns", "e2e_ns"))
    assert len(index) == len(columns) and (result.column("error") == "").all()
    assert violated(columns, index, sent, sent + e2e) == 0
    # Branches of one turn wait for it alone (the result's `after` names it) and are in flight together.
    at = {int(i): k for k, i in enumerate(index.tolist())}
    after = result.column("after")
    by_parent: dict[int, list[int]] = {}
    for dep, row in edges(columns):
        if int(columns.parent_id[row]) == int(columns.chat_id[dep]) and not len(columns.joins_of(row)):
            by_parent.setdefault(dep, []).append(at[row])
            assert int(after[at[row]]) == dep
    wide = [k for k in by_parent.values() if len(k) >= 3]
    assert wide
    for siblings in wide:
        spread = sent[siblings].max() - sent[siblings].min()
        assert spread < e2e[siblings].sum() - e2e[siblings].max()  # one after another takes at least that


def test_agent_sessions_reported_by_makespan_beside_production(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recorded agent sessions replayed on a fast and a slow candidate: the report gives each
    session's makespan, latency by depth and cached share per call beside production's, and a
    makespan SLO makes the verdict count sessions."""
    sessions = random_sessions(random.Random(11), 4, max_fan_out=3, max_depth=3)
    with sim("--speed", "10") as engine, start_proxy(engine.url, tmp_path / "traces") as proxy:
        asyncio.run(AgentClient(proxy.url).run(sessions))
        assert proxy.stop() == 0
    (path,) = sorted((tmp_path / "traces").glob("*.rpt"))
    columns = trace.load(path)
    runs = []
    for name, speed in (("fast", "10"), ("slow", "2")):
        with sim("--speed", speed) as candidate:
            out = tmp_path / f"{name}.rpr"
            replay(path, candidate.url, out, "--no-calibrate", "--sessions", "closed", "--label", name)
            runs.append(str(out))
    capsys.readouterr()  # the replays' summaries
    assert main(["report", *runs, "--baseline", str(path), "--slo", "makespan<=600s", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_label = {r["label"]: r for r in doc["runs"]}
    depths = int(columns.turn.max())
    for label, run in by_label.items():
        assert run["sessions"]["sessions"] == len(sessions), label
        good = run["goodput"]["sessions"]
        assert (good["good"], good["of"]) == (len(sessions), len(sessions)), label
        rows = run["sessions"]["by_depth"]
        assert sum(r["requests"] for r in rows) == len(columns) and rows[0]["depth"] == "0", label
        assert len(rows) >= min(depths, 2), label
    assert by_label["slow"]["sessions"]["session_s"]["p50"] > by_label["fast"]["sessions"]["session_s"]["p50"]
    assert {c["label"] for c in doc["verdict"]["candidates"]} == {"fast", "slow"}
    assert all(c["sessions"] == len(sessions) for c in doc["verdict"]["candidates"])
    # the sim reports cached prompt tokens; production's were recorded by the proxy, call by call
    share = by_label["fast"]["cached_share"]
    assert share is not None and share["per_call"]["count"] == len(columns)
    assert share["recorded"] is not None and share["recorded"]["count"] > 0


def graph_by_seed(columns: trace.Columns) -> dict[int, tuple[int | None, tuple[int, ...]]]:
    """Per request (by its `seed`), the seeds of the request it continues and of those it joins."""
    seed_of = {
        int(c): int(s["seed"])
        for c, s in zip(columns.chat_id.tolist(), columns.sampling.tolist(), strict=True)
        if c
    }
    out = {}
    for row, sampling in enumerate(columns.sampling.tolist()):
        parent = seed_of.get(int(columns.parent_id[row]))
        out[int(sampling["seed"])] = (parent, tuple(seed_of[int(j)] for j in columns.joins_of(row)))
    return out


def test_a_live_replay_sends_each_join_with_every_reply_it_joins(tmp_path: Path) -> None:
    """Replayed with live replies through a second recording proxy: that proxy links each replayed
    request to the replayed replies its body carries, so the graph it records is the original one
    only if every join's body held the candidate's reply of each request it joins (and of the turn
    it continues), where the recorded context had it. The joins quote the answers as assistant
    messages: tool results go out as user messages (a tool message needs the call it answers), which
    a proxy does not link (tests/replay/test_replies.py checks their slots)."""
    sessions = [
        replace(s, steps=tuple(replace(step, quoted=True) for step in s.steps))
        for s in random_sessions(random.Random(11), 4, max_fan_out=4, max_depth=3)
    ]
    with sim("--speed", "10") as engine, start_proxy(engine.url, tmp_path / "traces") as proxy:
        asyncio.run(AgentClient(proxy.url).run(sessions))
        assert proxy.stop() == 0
    paths = sorted((tmp_path / "traces").glob("*.rpt"))
    columns = trace.load(paths)
    assert any(len(columns.joins_of(row)) >= 2 for row in range(len(columns)))
    live = ("--no-calibrate", "--sessions", "closed", "--replies", "live", "--seed", "3")
    with (
        sim("--speed", "5", "--output-seed", "9") as slower,
        start_proxy(slower.url, tmp_path / "again") as proxy,
    ):
        result = replay(paths[0], proxy.url, tmp_path / "r.rpr", *live)
        assert proxy.stop() == 0
    index, sent, e2e = (result.column(c) for c in ("index", "sent_ns", "e2e_ns"))
    assert len(index) == len(columns) and (result.column("error") == "").all()
    assert violated(columns, index, sent, sent + e2e) == 0
    again = trace.load(sorted((tmp_path / "again").glob("*.rpt")))
    assert graph_by_seed(again) == graph_by_seed(columns)


def test_an_imported_agent_trace_replays_closed_loop_with_no_edge_violated(tmp_path: Path) -> None:
    """Claude Code sessions in the WEKA format (sub-agents spawned, joined by the parent's next
    request) and an agentic-Mooncake session, imported and replayed against a sim slower than the
    recording at `--speed 10`: sent at their offsets (open loop) some requests would go before a
    reply they wait for ended; closed loop, none does."""
    src = tmp_path / "weka"
    src.mkdir()
    for name in ("8712b46f-04e", "f99f3001-351"):
        (src / f"{name}.json").write_text(json.dumps(weka_trace(name)))
    mooncake = lines(tmp_path / "am.jsonl", mooncake_rows())
    for source, kind in ((src, "weka"), (mooncake, "agentic-mooncake")):
        imported = tmp_path / f"{kind}.rpt"
        assert main(["import", str(source), "--format", kind, "-o", str(imported)]) == 0
        columns = trace.load([imported])
        assert any(len(columns.joins_of(row)) for row in range(len(columns)))
        counts = {}
        with sim() as slow:
            for mode in ("open", "closed"):
                out = tmp_path / f"{kind}-{mode}.rpr"
                options = ("--no-calibrate", "--sessions", mode, "--speed", "10", "--model", MODEL)
                result = replay(imported, slow.url, out, *options)
                index, sent, e2e = (result.column(c) for c in ("index", "sent_ns", "e2e_ns"))
                assert len(index) == len(columns) and (result.column("error") == "").all()
                counts[mode] = violated(columns, index, sent, sent + e2e)
        assert counts["closed"] == 0 and counts["open"] > 0, (kind, counts)
