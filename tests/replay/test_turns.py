"""Whole-session selection and turn links, over trace columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replayproxy.replay import turns
from replayproxy.replay.schedule import TraceSlice
from replayproxy.shape import RequestShape
from replayproxy.trace import Columns, load
from tests.replay import traces

S = 1_000_000_000


def columns(tmp_path: Path) -> Columns:
    """Sessions 1 (3 turns), 2 (2 turns) and 3 (1 turn), interleaved with two lone requests."""
    rows = [  # (offset s, session, turn, e2e s, think s)
        (0, 1, 0, 1, -1), (1, 0, 0, 1, -1), (2, 2, 0, 1, -1), (3, 1, 1, 1, 0.5),
        (4, 3, 0, 1, -1), (5, 2, 1, 1, -1), (6, 0, 0, 1, -1), (7, 1, 2, 1, 2),
    ]  # fmt: skip
    shapes = [
        RequestShape(
            offset_ns=int(o * S), session=s, turn=t, e2e_ns=int(e * S), think_ns=int(k * S) if k >= 0 else -1
        )
        for o, s, t, e, k in rows
    ]
    return load(traces.write(tmp_path / "t.rpt", shapes))


def test_closed_loop_is_the_default_only_for_multi_turn_traces(tmp_path: Path) -> None:
    cols = columns(tmp_path)
    assert turns.resolve("auto", cols) == "closed" and turns.resolve("open", cols) == "open"
    single = load(traces.write(tmp_path / "s.rpt", [RequestShape(offset_ns=0, session=5)]))
    assert turns.resolve("auto", single) == "open"
    with pytest.raises(ValueError, match="--sessions must be one of auto, closed, open"):
        turns.resolve("half", cols)


def test_closed_loop_keeps_sessions_whole(tmp_path: Path) -> None:
    cols = columns(tmp_path)
    assert turns.select_rows(cols, TraceSlice(limit=2), "closed").tolist() == [0, 3, 7]  # one session, whole
    assert turns.select_rows(cols, TraceSlice(limit=4), "closed").tolist() == [0, 1, 3, 7]
    assert turns.select_rows(cols, TraceSlice(limit=2), "open").tolist() == [0, 1]
    window = TraceSlice(start_offset_s=1.5, duration_s=2)  # first turns at 2 s (session 2) only
    assert turns.select_rows(cols, window, "closed").tolist() == [2, 5]
    assert turns.select_rows(cols, window, "open").tolist() == [2, 3]


def test_sampling_is_by_whole_session_and_seeded(tmp_path: Path) -> None:
    cols = columns(tmp_path)
    picks = {tuple(turns.select_rows(cols, TraceSlice(), "closed", 0.5, seed).tolist()) for seed in range(12)}
    assert len(picks) > 2  # seeds choose differently
    group = turns.groups(cols)
    for pick in picks:
        kept = set(pick)
        assert all(set(np.flatnonzero(group == group[r]).tolist()) <= kept for r in kept)
    assert turns.select_rows(cols, TraceSlice(), "closed", 0.5, 3).tolist() == list(
        turns.select_rows(cols, TraceSlice(), "closed", 0.5, 3)
    )
    with pytest.raises(ValueError, match="sample-sessions"):
        turns.select_rows(cols, TraceSlice(), "closed", 0.0)


def test_links_use_recorded_think_time_else_the_recorded_gap(tmp_path: Path) -> None:
    cols = columns(tmp_path)
    rows = np.arange(len(cols))
    links = turns.links(cols, rows, speed=2.0)
    assert links.after.tolist() == [-1, -1, -1, 0, -1, 2, -1, 3]
    # row 3: recorded 0.5 s; row 5: gap 5 - (2 + 1) = 2 s; row 7: recorded 2 s; all at speed 2
    assert links.think_ns.tolist() == [-1, -1, -1, S // 4, -1, S, -1, S]
    assert turns.first_turns(rows, links.after).tolist() == [0, 1, 2, 0, 4, 2, 6, 0]


def graph(tmp_path: Path) -> Columns:
    """An agent session (5): root 0, branches 1 and 2, join 3 (continues 1, joins 2), a request
    naming only replies not in the trace (4), a sub-agent spawned by the join (5), a request naming
    replies twice (8); and session 6 without reply hashes (6, 7)."""
    rows = [  # (offset s, session, e2e s, think s, chat, parent, joins, spawned)
        (0, 5, 1, -1, 11, 0, (), False), (2, 5, 3, 1, 12, 11, (), False), (2, 5, 5, 1, 13, 11, (), False),
        (9, 5, 1, -1, 14, 12, (13,), False), (10, 5, 1, 3, 15, 99, (98,), False),
        (11, 5, 1, 0.5, 16, 14, (), True), (12, 6, 1, -1, 0, 0, (), False), (14, 6, 1, 1, 0, 0, (), False),
        (15, 5, 1, 2, 17, 14, (13, 14, 12, 13), False),
    ]  # fmt: skip
    shapes = [
        RequestShape(
            offset_ns=int(o * S), session=s, e2e_ns=int(e * S), think_ns=int(k * S) if k >= 0 else -1,
            chat_id=c, parent_id=p, join_ids=j, spawned=sp,
        )
        for o, s, e, k, c, p, j, sp in rows
    ]  # fmt: skip
    return load(traces.write(tmp_path / "g.rpt", shapes))


def joins(links: turns.Links) -> list[list[int]]:
    index = links.join_index
    return [links.joins[index[i] : index[i + 1]].tolist() for i in range(len(index) - 1)]


def test_graph_links_name_the_turn_continued_and_every_request_joined(tmp_path: Path) -> None:
    cols = graph(tmp_path)
    rows = np.arange(len(cols))
    links = turns.links(cols, rows, speed=2.0)
    # 4 names only replies not in the trace: its offset; 7 names none: its session's previous turn
    assert links.after.tolist() == [-1, 0, 0, 1, -1, 3, -1, 6, 3]
    assert joins(links) == [[], [], [], [2], [], [], [], [], [2, 1]]  # each once, in order
    # row 3: 9 s - the last recorded end among 1 and 2 (2 + 5 s) = 2 s, at speed 2
    assert links.think_ns.tolist() == [-1, S // 2, S // 2, S, -1, S // 4, -1, S // 2, S]
    first = turns.first_turns(rows, links.after, links.joins, links.join_index)
    assert first.tolist() == [0, 0, 0, 0, 4, 0, 6, 6, 0]


def test_graph_links_among_selected_rows_only(tmp_path: Path) -> None:
    cols = graph(tmp_path)
    rows = np.array([0, 1, 3, 8])  # branch 2 sampled out
    links = turns.links(cols, rows, speed=1.0)
    assert links.after.tolist() == [-1, 0, 1, 3]
    assert joins(links) == [[], [], [], [1]]
    # row 3 without a recorded think time: from the end of branch 1 (2 + 3 s), the one left
    assert links.think_ns.tolist() == [-1, S, 4 * S, 2 * S]
    chained = turns.first_turns(rows, links.after)
    assert chained.tolist() == turns.first_turns(rows, links.after, links.joins, links.join_index).tolist()
