"""What a sender gets from the planner: the schedule (a few numbers per request, known up front)
and each prepared request (its body serialized), the data the preparer, the feed, the window and
the runner share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from replayproxy.replay import turns
from replayproxy.trace import ragged_rows


@dataclass(frozen=True, slots=True)
class Prepared:
    """One request, fully serialized; `scheduled_ns` is relative to the run start."""

    index: int  # row in the arrival-sorted trace
    scheduled_ns: int
    endpoint: str
    path: str
    body: bytes
    stream: bool
    expected_input_tokens: int
    expected_output_tokens: int
    template_key: str = ""  # chat calibration key ("" for completions)
    expected_shared_tokens: int = 0  # prefix tokens an earlier request had, as the trace says
    planned_shared_tokens: int = 0  # prefix tokens the bodies share with the donor's (-1: approximate)
    exact: bool = False  # built through the target's tokenizer: length and sharing are exact
    session: int = 0  # the trace's session id; 0 outside sessions
    turn: int = 0
    after: int = turns.NONE  # trace index of the session's previous selected turn (closed loop waits for it)
    think_ns: int = turns.NONE  # wait after that turn's end (ns, at the run's speed)
    first: int = turns.NONE  # trace index of the session's first replayed turn (sessions stay together)
    joins: tuple[int, ...] = ()  # trace indexes of further requests it waits for (a join's branches)
    join_slots: tuple[int, ...] = ()  # message indexes where its recorded context had their replies
    spawned: bool = False  # `after` is a dependency only: it opens its own context

    @property
    def group(self) -> int:
        """What keeps a session on one worker or shard: its first turn's index, else its own."""
        return self.first if self.first >= 0 else self.index


class Schedule(NamedTuple):
    """When and after what each planned request goes, per position in planning order: all a
    sender needs before the bodies arrive (a few numbers per request, so any trace fits)."""

    trace_index: np.ndarray  # int64: row in the arrival-sorted trace
    scheduled_ns: np.ndarray  # int64: relative to the run start
    after: np.ndarray  # int64: trace index of the session's previous selected turn, or turns.NONE
    think_ns: np.ndarray  # int64: wait after that turn's end (at the run's speed), or turns.NONE
    first: np.ndarray  # int64: trace index of the session's first replayed turn, or turns.NONE
    joins: np.ndarray  # int64: trace indexes of further requests each waits for, laid end to end...
    join_index: np.ndarray  # int64: ...position i's are joins[join_index[i]:join_index[i + 1]]

    def joins_of(self, position: int) -> tuple[int, ...]:
        """The trace indexes of the further requests `position` waits for besides `after`."""
        return tuple(self.joins[self.join_index[position] : self.join_index[position + 1]].tolist())

    @property
    def group(self) -> np.ndarray:
        """What keeps a session on one worker or shard (Prepared.group, for every position)."""
        out: np.ndarray = np.where(self.first >= 0, self.first, self.trace_index)
        return out

    def take(self, positions: np.ndarray) -> Schedule:
        joins, join_index = ragged_rows(self.joins, self.join_index, positions)
        trace_index, scheduled_ns, after, think_ns, first = (c[positions] for c in self[:5])
        return Schedule(trace_index, scheduled_ns, after, think_ns, first, joins, join_index)


def schedule_of(prepared: Sequence[Prepared]) -> Schedule:
    """The schedule of requests prepared up front (in schedule order)."""

    def column(name: str) -> np.ndarray:
        return np.array([getattr(p, name) for p in prepared], np.int64)

    join_index = np.zeros(len(prepared) + 1, np.int64)
    np.cumsum([len(p.joins) for p in prepared], out=join_index[1:])
    joins = np.array([j for p in prepared for j in p.joins], np.int64)
    return Schedule(column("index"), column("scheduled_ns"), column("after"), column("think_ns"),
                    column("first"), joins, join_index)  # fmt: skip
