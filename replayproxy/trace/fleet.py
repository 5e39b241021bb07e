"""Sessions joined across recorders: a fleet's files read as one workload.

Each recorder links the turns it sees (proxy.links): a request continues the earlier reply whose
keyed `chat_id` equals its `parent_id`. Behind a router that spreads one conversation over several
pods, the pod that gets turn 2 never saw turn 1's reply, so it starts a new session there (turn 0,
think time unknown). Sidecars sharing a hash key compute the same ids, so once all files are read
together such a turn finds its parent by id, and takes the parent's session, the next turn number
and the think time from the parent's end to its own arrival. Runs once per load, in arrival order,
over the orphaned turns only.

Arrivals and ends are on each recorder's wall clock. Pods whose clocks disagree by up to
`REPLAYPROXY_FLEET_CLOCK_SKEW_S` seconds (default 1) still join: a parent counts as ended before
its continuation if its end is at most that much after the continuation's arrival, wherever the
merge put it. A joined turn's think time then carries the skew (clipped at 0).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from replayproxy.errors import BadOption

SKEW_VARIABLE = "REPLAYPROXY_FLEET_CLOCK_SKEW_S"
DEFAULT_SKEW_S = 1.0
NEEDED = ("offset_ns", "e2e_ns", "session", "turn", "think_ns", "chat_id", "parent_id")


def skew_ns(environ: Mapping[str, str] | None = None) -> int:
    """The clock skew between recorders that a join tolerates, from the environment."""
    raw = (os.environ if environ is None else environ).get(SKEW_VARIABLE, "")
    try:
        seconds = float(raw) if raw.strip() else DEFAULT_SKEW_S
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < 3600:
        raise BadOption(f"{SKEW_VARIABLE} must be seconds in [0, 3600), got {raw!r}")
    return int(seconds * 1e9)


def join_sessions(scalar: dict[str, np.ndarray], skew: int | None = None) -> int:
    """Relink, in place in `scalar` (arrival order), the turns whose parent a recorder did not see,
    tolerating `skew` ns between recorders' clocks (default: `skew_ns()`); returns how many were
    joined. Columns that are not all loaded leave the trace as it is."""
    if not all(name in scalar for name in NEEDED):
        return 0
    parent_id, turn, think = scalar["parent_id"], scalar["turn"], scalar["think_ns"]
    orphans = np.flatnonzero((parent_id != 0) & (turn == 0) & (think < 0))
    if not len(orphans):
        return 0
    chat_id = scalar["chat_id"]
    wanted = np.unique(parent_id[orphans])
    holders = np.flatnonzero(np.isin(chat_id, wanted))
    if not len(holders):
        return 0
    offsets, e2e = scalar["offset_ns"], scalar["e2e_ns"]
    ends = offsets[holders] + np.maximum(e2e[holders], 0)
    by_id: dict[int, list[tuple[int, int]]] = {}
    for row, chat, end in zip(holders.tolist(), chat_id[holders].tolist(), ends.tolist(), strict=True):
        by_id.setdefault(chat, []).append((row, end))
    for name in ("session", "turn", "think_ns"):
        scalar[name] = np.array(scalar[name])  # a mapped or shared column becomes this load's own
    session, turn, think = scalar["session"], scalar["turn"], scalar["think_ns"]
    # A joined turn's own session (the one its recorder started) may hold later turns that recorder
    # linked to it: they move with it, their turn numbers shifted alike.
    moved: dict[int, tuple[int, int]] = {}  # recorder's session -> (joined session, turn shift)
    continued: set[int] = set()
    tolerance = skew_ns() if skew is None else skew
    for row in orphans.tolist():
        arrival = int(offsets[row])
        parent = _parent(by_id.get(int(parent_id[row]), []), arrival + tolerance, continued, row)
        if parent is None:
            continue
        prow, end = parent
        continued.add(prow)
        joined_session, parent_turn = _resolved(moved, int(session[prow]), int(turn[prow]))
        moved[int(session[row])] = (joined_session, parent_turn + 1)
        session[row], turn[row] = joined_session, parent_turn + 1
        think[row] = max(0, arrival - end)
    followers = np.flatnonzero(np.isin(session, np.fromiter(moved, np.uint64, len(moved))) & (turn > 0))
    for row in followers.tolist():
        session[row], turn[row] = _resolved(moved, int(session[row]), int(turn[row]))
    return len(moved)


def _resolved(moved: dict[int, tuple[int, int]], session: int, turn: int) -> tuple[int, int]:
    while session in moved:
        session, shift = moved[session]
        turn += shift
    return session, turn


def _parent(
    candidates: Sequence[tuple[int, int]], latest_end: int, continued: set[int], row: int
) -> tuple[int, int] | None:
    """As the recorder chooses (proxy.links): of the turns with that reply which ended by
    `latest_end` (the arrival, plus the skew tolerated), the oldest not yet continued, else the
    newest (a retry continues the same session)."""
    ended = [(r, end) for r, end in candidates if r != row and end <= latest_end]
    if not ended:
        return None
    for r, end in ended:
        if r not in continued:
            return r, end
    return ended[-1]
