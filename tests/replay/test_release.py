"""The release ledger on numbers: scripted event sequences and generated schedules, no socket, no clock."""

from __future__ import annotations

import heapq

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from replayproxy.replay.prepared import Schedule
from replayproxy.replay.release import Continuation, Ledger

START = 1_000_000
NONE = -1


def schedule(
    offsets: list[int],
    after: list[int] | None = None,
    think: list[int] | None = None,
    joins: list[list[int]] | None = None,
) -> Schedule:
    """Positions are trace indexes; `after`/`think`/`joins` per position (NONE, []: a first turn)."""
    count = len(offsets)
    after = after if after is not None else [NONE] * count
    think = think if think is not None else [NONE] * count
    joins = joins if joins is not None else [[] for _ in range(count)]
    first = [NONE] * count
    column = lambda values: np.array(values, np.int64)  # noqa: E731
    join_index = column([0, *np.cumsum([len(j) for j in joins], dtype=np.int64).tolist()])
    flat = column([j for js in joins for j in js])
    return Schedule(column(range(count)), column(offsets), column(after), column(think), column(first), flat,
                    join_index)  # fmt: skip


def take_next(ledger: Ledger) -> tuple[int, int]:
    due = ledger.next()
    assert due is not None
    assert ledger.take(due[1])
    return due


def test_open_loop_sends_each_request_at_the_start_plus_its_offset() -> None:
    ledger = Ledger(schedule([0, 5, 5, 9], after=[NONE, 0, NONE, 1], think=[NONE, 1, NONE, 1]), START,
                    closed_loop=False)  # fmt: skip
    assert [take_next(ledger) for _ in range(4)] == [
        (START, 0),
        (START + 5, 1),
        (START + 5, 2),
        (START + 9, 3),
    ]
    assert ledger.next() is None
    assert ledger.ended(0, START + 100, extendable=False) == []  # nothing waits in open loop


def test_closed_loop_releases_a_later_turn_at_the_end_of_the_turn_before_plus_its_think_time() -> None:
    ledger = Ledger(schedule([0, 20, 40, 30], after=[NONE, 0, 1, NONE], think=[NONE, 30, 7, NONE]), START,
                    closed_loop=True)  # fmt: skip
    assert take_next(ledger) == (START, 0)
    ledger.sent()
    assert take_next(ledger) == (START + 30, 3)  # turns 1 and 2 wait, whatever their offsets
    assert ledger.next() is None
    assert ledger.ended(0, START + 500, extendable=False) == [Continuation(1, 0, START + 500)]
    ledger.release(1, START + 500)
    assert take_next(ledger) == (START + 530, 1)
    assert ledger.ended(1, START + 900, extendable=True) == [Continuation(2, 1, START + 900)]
    ledger.release(2, START + 900)
    assert take_next(ledger) == (START + 907, 2)
    assert ledger.next() is None


def test_a_turn_whose_previous_turn_is_another_senders_keeps_its_offset() -> None:
    turns = schedule([0, 20], after=[NONE, 77], think=[NONE, 30])  # trace index 77 is not ours
    ledger = Ledger(turns, START, closed_loop=True)
    assert [take_next(ledger) for _ in range(2)] == [(START, 0), (START + 20, 1)]


def test_a_released_turn_goes_before_a_later_timed_one_and_ties_go_to_the_released() -> None:
    ledger = Ledger(
        schedule([0, 10, 50], after=[NONE, 0, NONE], think=[NONE, 5, NONE]), START, closed_loop=True
    )
    take_next(ledger)
    ledger.sent()
    for free in ledger.ended(0, START + 45, extendable=False):
        ledger.release(free.position, free.end_ns)
    assert take_next(ledger) == (START + 50, 1)
    assert take_next(ledger) == (START + 50, 2)


def test_negative_think_times_release_at_the_end() -> None:
    ledger = Ledger(schedule([0, 10], after=[NONE, 0], think=[NONE, -3]), START, closed_loop=True)
    take_next(ledger)
    ledger.release(1, START + 70)
    assert take_next(ledger) == (START + 70, 1)


def test_a_relinked_request_leaves_the_timed_order_and_waits_for_the_turn_it_extends() -> None:
    ledger = Ledger(schedule([0, 10, 20]), START, closed_loop=True)
    assert take_next(ledger) == (START, 0)
    ledger.sent()
    assert ledger.relinked(1, [0], 25) is None  # the planner found it extends turn 0, still running
    assert take_next(ledger) == (START + 20, 2)  # 1 is skipped
    assert ledger.next() is None
    assert ledger.ended(0, START + 300, extendable=False) == [Continuation(1, 0, START + 300)]
    ledger.release(1, START + 300)
    assert take_next(ledger) == (START + 325, 1)


def test_a_relinked_request_whose_turn_already_ended_is_free_at_that_end() -> None:
    ledger = Ledger(schedule([0, 10, 20]), START, closed_loop=True)
    take_next(ledger)
    ledger.sent()
    ledger.ended(0, START + 4, extendable=True)  # a later chat turn: requests arriving later may extend it
    assert ledger.relinked(2, [0], 9) == Continuation(2, 0, START + 4)
    ledger.release(2, START + 4)
    assert [take_next(ledger) for _ in range(2)] == [(START + 10, 1), (START + 13, 2)]


def test_relinks_are_ignored_in_open_loop_and_to_another_senders_turn() -> None:
    for closed_loop, parent in ((False, 0), (True, 99)):
        ledger = Ledger(schedule([0, 10]), START, closed_loop=closed_loop)
        assert ledger.relinked(1, [parent], 5) is None
        assert [take_next(ledger) for _ in range(2)] == [(START, 0), (START + 10, 1)]


def test_a_request_taken_before_it_arrived_relinked_is_withdrawn_once() -> None:
    ledger = Ledger(schedule([0, 10]), START, closed_loop=True)
    take_next(ledger)
    ledger.sent()
    assert take_next(ledger) == (START + 10, 1)  # due, its body not here yet
    ledger.relinked(1, [0], 5)  # ...it arrives linked to turn 0
    assert ledger.withdrawn(1) and not ledger.withdrawn(1)
    ledger.release(1, START + 50)
    assert take_next(ledger) == (START + 55, 1)  # sent once, after the turn it extends


def test_a_request_relinked_while_its_deadline_was_awaited_is_not_taken() -> None:
    ledger = Ledger(schedule([0, 10]), START, closed_loop=True)
    take_next(ledger)
    ledger.sent()
    assert ledger.next() == (START + 10, 1)
    ledger.relinked(1, [0], 5)
    assert not ledger.take(1)
    assert ledger.next() is None


def test_a_request_moved_to_another_sender_is_never_due_here() -> None:
    ledger = Ledger(schedule([0, 10, 20]), START, closed_loop=True)
    ledger.moved_away(1)
    assert [take_next(ledger) for _ in range(2)] == [(START, 0), (START + 20, 2)]
    assert ledger.next() is None


def test_a_request_moved_here_waits_for_every_one_of_its_parents() -> None:
    """A request joined past the schedule with two parents (a session graph's join): due at the
    last parent's end plus its own think time, whichever ends last."""
    ledger = Ledger(schedule([0, 5]), START, closed_loop=True)
    for _ in range(2):
        take_next(ledger)
        ledger.sent()
    assert ledger.joined(2, [0, 1], 40) is None
    assert ledger.ended(1, START + 900, extendable=False) == []  # one parent still runs
    assert ledger.ended(0, START + 600, extendable=False) == [Continuation(2, 1, START + 900)]
    ledger.release(2, START + 900)
    assert take_next(ledger) == (START + 940, 2)


def test_a_request_moved_here_after_its_parents_ended_goes_at_the_latest_end() -> None:
    ledger = Ledger(schedule([0, 5]), START, closed_loop=True)
    for index, end in ((0, START + 70), (1, START + 30)):
        take_next(ledger)
        ledger.sent()
        ledger.ended(index, end, extendable=True)
    assert ledger.joined(2, [0, 1], 8) == Continuation(2, 0, START + 70)


def test_the_concurrency_cap_counts_requests_in_flight() -> None:
    ledger = Ledger(schedule([0, 0, 0]), START, closed_loop=False, max_concurrency=2)
    assert ledger.has_slot
    ledger.sent()
    ledger.sent()
    assert not ledger.has_slot
    ledger.ended(0, START + 1, extendable=False)
    assert ledger.has_slot and ledger.in_flight == 1


# Generated schedules: sessions of turns, each turn a duration; a discrete-event run of the ledger.

session = st.lists(
    st.tuples(st.integers(0, 50_000), st.integers(-5, 20_000), st.integers(0, 60_000)), min_size=1, max_size=5
)  # per turn: gap after the previous turn's arrival, think time, duration


def build(sessions: list[list[tuple[int, int, int]]], starts: list[int]) -> tuple[Schedule, list[int]]:
    """Arrival-ordered positions (trace indexes) with each later turn after its session's previous."""
    turns = []  # (offset, session, turn, think, duration)
    for number, (turns_of, start) in enumerate(zip(sessions, starts, strict=False)):
        offset = start
        for turn, (gap, think, duration) in enumerate(turns_of):
            offset += gap if turn else 0
            turns.append((offset, number, turn, think, duration))
    turns.sort()
    index_of = {(number, turn): i for i, (_, number, turn, _, _) in enumerate(turns)}
    after = [index_of[(number, turn - 1)] if turn else NONE for _, number, turn, _, _ in turns]
    think = [t if turn else NONE for _, _, turn, t, _ in turns]
    return schedule([t[0] for t in turns], after, think), [t[4] for t in turns]


def run(ledger: Ledger, durations: list[int]) -> tuple[dict[int, tuple[int, int]], dict[int, int], int]:
    """Send each due request at max(now, deadline), end it `durations[position]` later; returns
    position -> (deadline, sent), position -> end, and the most requests in flight at once."""
    now, flying, sent, ends, most = START, [], {}, {}, 0
    while True:
        due = ledger.next()
        if flying and (due is None or flying[0][0] <= max(now, due[0]) or not ledger.has_slot):
            end, position = heapq.heappop(flying)
            now = max(now, end)
            ends[position] = end
            for free in ledger.ended(position, end, extendable=True):
                ledger.release(free.position, free.end_ns)
            continue
        if due is None:
            return sent, ends, most
        deadline, position = due
        assert ledger.take(position) and position not in sent
        now = max(now, deadline)
        ledger.sent()
        most = max(most, ledger.in_flight)
        sent[position] = (deadline, now)
        heapq.heappush(flying, (now + durations[position], position))


@settings(max_examples=150, deadline=None)
@given(st.lists(session, min_size=1, max_size=6), st.lists(st.integers(0, 100_000), min_size=6, max_size=6),
       st.booleans(), st.integers(0, 3))  # fmt: skip
def test_generated_schedules_send_everything_once_by_the_rules(
    sessions: list[list[tuple[int, int, int]]], starts: list[int], closed_loop: bool, cap: int
) -> None:
    planned, durations = build(sessions, starts)
    sent, ends, most = run(Ledger(planned, START, closed_loop=closed_loop, max_concurrency=cap), durations)
    assert sorted(sent) == list(range(len(durations)))  # each request sent exactly once
    assert not cap or most <= cap
    for position, (deadline, at) in sent.items():
        assert at >= deadline
        parent = int(planned.after[position])
        if closed_loop and parent >= 0:  # released at the previous turn's end plus the think time
            assert deadline == ends[parent] + max(int(planned.think_ns[position]), 0)
            assert at >= ends[parent]
        else:
            assert deadline == START + int(planned.scheduled_ns[position])


# Session graphs: a request waits for the turn it continues and every request it joins.


def test_a_join_is_released_when_the_last_of_its_branches_ended_plus_its_think_time() -> None:
    """Root 0 fans out branches 1-3; join 4 continues branch 1 and joins 2 and 3."""
    graph = schedule([0, 10, 10, 10, 40], after=[NONE, 0, 0, 0, 1], think=[NONE, 2, 3, 4, 25],
                     joins=[[], [], [], [], [2, 3]])  # fmt: skip
    ledger = Ledger(graph, START, closed_loop=True)
    assert take_next(ledger) == (START, 0)
    ledger.sent()
    assert ledger.next() is None  # the branches wait for the root, the join for all of them
    released = ledger.ended(0, START + 100, extendable=False)
    assert released == [Continuation(p, 0, START + 100) for p in (1, 2, 3)]
    for free in released:
        ledger.release(free.position, free.end_ns)
    assert [take_next(ledger) for _ in range(3)] == [(START + 102, 1), (START + 103, 2), (START + 104, 3)]
    for _ in range(3):
        ledger.sent()
    assert ledger.ended(3, START + 700, extendable=False) == []  # a branch ending last as recorded...
    assert ledger.ended(1, START + 300, extendable=False) == []
    assert ledger.next() is None
    assert ledger.ended(2, START + 900, extendable=False) == [Continuation(4, 2, START + 900)]  # ...or not
    ledger.release(4, START + 900)
    assert take_next(ledger) == (START + 925, 4)


def test_a_join_waits_only_for_the_parents_in_the_schedule_and_keeps_its_offset_without_any() -> None:
    """Join 2 continues 0 and joins 77 (not replayed); join 3 names only requests not replayed."""
    graph = schedule([0, 5, 20, 30], after=[NONE, NONE, 0, 88], think=[NONE, NONE, 6, 9],
                     joins=[[], [], [77, 1], [77]])  # fmt: skip
    ledger = Ledger(graph, START, closed_loop=True)
    assert [take_next(ledger) for _ in range(2)] == [(START, 0), (START + 5, 1)]
    ledger.sent()
    ledger.sent()
    assert take_next(ledger) == (START + 30, 3)  # its parents are all absent: open loop
    assert ledger.ended(0, START + 50, extendable=False) == []
    assert ledger.ended(1, START + 40, extendable=False) == [Continuation(2, 0, START + 50)]


def test_a_relinked_join_waits_for_every_one_of_its_parents() -> None:
    ledger = Ledger(schedule([0, 0, 10]), START, closed_loop=True)
    for _ in range(2):
        take_next(ledger)
        ledger.sent()
    assert ledger.relinked(2, [0, 1], 4) is None
    assert ledger.ended(0, START + 80, extendable=False) == []
    assert ledger.ended(1, START + 60, extendable=False) == [Continuation(2, 0, START + 80)]


ABSENT = 10_000  # a trace index no sender replays (cut, failed, sampled out)


@st.composite
def graphs(draw: st.DrawFn) -> tuple[Schedule, list[int]]:
    """Requests in arrival order, each continuing an earlier one (or none, or one not replayed) and
    joining up to three more; with think times and durations."""
    count = draw(st.integers(1, 14))
    offsets = sorted(draw(st.lists(st.integers(0, 100_000), min_size=count, max_size=count)))
    after, joins, think, durations = [], [], [], []
    for position in range(count):
        earlier = [*range(position), ABSENT]
        parent = draw(st.sampled_from([NONE, *earlier]))
        more = draw(st.lists(st.sampled_from(earlier), max_size=3, unique=True))
        after.append(parent)
        joins.append([j for j in more if j != parent])
        think.append(draw(st.integers(-5, 20_000)))
        durations.append(draw(st.integers(0, 60_000)))
    return schedule(offsets, after, think, joins), durations


@settings(max_examples=200, deadline=None)
@given(graphs(), st.booleans(), st.integers(0, 3))
def test_generated_graphs_release_each_request_at_the_end_of_its_last_parent_plus_its_think_time(
    graph: tuple[Schedule, list[int]], closed_loop: bool, cap: int
) -> None:
    planned, durations = graph
    sent, ends, most = run(Ledger(planned, START, closed_loop=closed_loop, max_concurrency=cap), durations)
    assert sorted(sent) == list(range(len(durations)))  # each request sent exactly once
    assert not cap or most <= cap
    for position, (deadline, at) in sent.items():
        named = [int(planned.after[position]), *planned.joins_of(position)]
        parents = [p for p in named if 0 <= p < len(durations)]  # those replayed
        if closed_loop and parents:
            assert all(at >= ends[p] for p in parents)  # never before all its parents ended
            last = max(ends[p] for p in parents)
            assert deadline == last + max(int(planned.think_ns[position]), 0)
        else:  # open loop, or every parent absent: its recorded offset
            assert deadline == START + int(planned.scheduled_ns[position])
