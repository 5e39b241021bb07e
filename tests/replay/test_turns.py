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
