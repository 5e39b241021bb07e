"""Session graphs at record time (proxy.linker), driven through build_shape with exact clocks:
synthetic agent sessions (fan-out 1-8, depth 1-5, tool waits, interleaved sessions) come back as
exactly the graph sent — parent, joins, depth, session, and think time from the last-ending
dependency to the nanosecond."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from replayproxy.proxy.linker import CROSS_SESSION_CHARS, SessionLinker
from replayproxy.shape import RequestShape
from tests.proxy.test_links import KEY, streamed, turn

MS = 1_000_000


@dataclass
class Planned:
    """A request of a synthetic session, its times in whole milliseconds."""

    tag: int
    session: int
    messages: list[dict[str, Any]]
    tokens: list[str]
    arrival_ms: int
    parent: int | None
    joins: tuple[int, ...]
    depth: int

    @property
    def end_ms(self) -> int:
        return self.arrival_ms + len(self.tokens) + 4  # streamed(): pieces 1..3+n ms, the end 1 ms later

    @property
    def reply(self) -> str:
        return "".join(self.tokens)


steps = st.lists(
    st.tuples(st.integers(1, 8), st.booleans(), st.integers(0, 50), st.integers(0, 400)),
    min_size=1,
    max_size=5,
)
sessions = st.lists(st.tuples(st.integers(0, 300), steps), min_size=1, max_size=3)


def plan(specs: list[tuple[int, list[tuple[int, bool, int, int]]]]) -> list[Planned]:
    """Every request of the sessions, replies unique per request and of lengths that differ, so
    parallel calls end at different times."""
    out: list[Planned] = []

    def add(
        session: int,
        messages: list[Any],
        arrival: int,
        parent: Planned | None,
        joins: tuple[int, ...],
        depth: int,
    ) -> Planned:
        tag = len(out)
        tokens = [f"r{tag}w{i} " for i in range(1 + (tag * 7) % 11)]
        out.append(
            Planned(
                tag, session, messages, tokens, arrival, None if parent is None else parent.tag, joins, depth
            )
        )
        return out[-1]

    for n, (start, session_steps) in enumerate(specs):
        context: list[Any] = [
            {"role": "system", "content": f"agent {n}"},
            {"role": "user", "content": f"task {n}"},
        ]
        base = add(n, context, start, None, (), 0)
        for s, (fan_out, quoted, spread, tool_wait) in enumerate(session_steps):
            context = [*context, {"role": "assistant", "content": base.reply}]
            asks = [{"role": "user", "content": f"sub {n}.{s}.{j}"} for j in range(fan_out)]
            calls = [
                add(n, [*context, a], base.end_ms + (j * spread) // 8, base, (), base.depth + 1)
                for j, a in enumerate(asks)
            ]
            arrival = max(c.end_ms for c in calls) + tool_wait
            depth = max(c.depth for c in calls) + 1
            if quoted:
                quotes = [
                    m
                    for a, c in zip(asks, calls, strict=True)
                    for m in (a, {"role": "assistant", "content": c.reply})
                ]
                context = [*context, *quotes, {"role": "user", "content": "combine"}]
                base = add(n, context, arrival, calls[0], tuple(c.tag for c in calls[1:]), depth)
            else:
                context = [*context, *({"role": "tool", "content": c.reply} for c in calls)]
                base = add(n, context, arrival, base, tuple(c.tag for c in calls), depth)
    return out


def record(planned: list[Planned]) -> dict[int, RequestShape]:
    """Shapes in the order the recorder sees them: by the end of their responses."""
    linker = SessionLinker(KEY)
    return {
        p.tag: turn(p.messages, streamed(p.tokens), p.arrival_ms, linker)
        for p in sorted(planned, key=lambda p: p.end_ms)
    }


@settings(max_examples=60, deadline=None)
@given(sessions)
def test_synthetic_agent_sessions_come_back_as_the_exact_graph(
    specs: list[tuple[int, list[tuple[int, bool, int, int]]]],
) -> None:
    planned = plan(specs)
    shapes = record(planned)
    by_tag = {p.tag: p for p in planned}
    session_ids: dict[int, int] = {}
    for p in planned:
        shape = shapes[p.tag]
        assert shape.chat_id != 0 and shape.e2e_ns == (p.end_ms - p.arrival_ms) * MS
        assert shape.parent_id == (0 if p.parent is None else shapes[p.parent].chat_id)
        assert shape.join_ids == tuple(shapes[j].chat_id for j in p.joins)
        assert shape.turn == p.depth and not shape.spawned
        deps = ([] if p.parent is None else [p.parent]) + list(p.joins)
        expected_think = (p.arrival_ms - max(by_tag[d].end_ms for d in deps)) * MS if deps else -1
        assert shape.think_ns == expected_think
        assert session_ids.setdefault(p.session, shape.session) == shape.session
        assert shape.tool_chars == 0  # every tool result here is a joined answer
    assert len(set(session_ids.values())) == len(session_ids)


def test_a_branch_of_an_earlier_turn_links_to_it_while_the_session_goes_on() -> None:
    """Turn 2 continues turn 1; later a request continues turn 0 again (a branch, not the latest)."""
    linker = SessionLinker(KEY)
    opening = [{"role": "user", "content": "q"}]
    first = turn(opening, streamed(["a0"]), 1000, linker)
    line = [*opening, {"role": "assistant", "content": "a0"}]
    second = turn([*line, {"role": "user", "content": "next"}], streamed(["a1"]), 1100, linker)
    branch = turn([*line, {"role": "user", "content": "other"}], streamed(["b"]), 1500, linker)
    assert second.parent_id == branch.parent_id == first.chat_id
    assert branch.session == second.session == first.session and branch.turn == second.turn == 1
    assert branch.think_ns == 1500 * MS - (first.offset_ns + first.e2e_ns)


def test_a_long_answer_from_another_session_is_a_join_and_a_short_one_is_not() -> None:
    """A sub-agent with its own context returns its answer as a tool result: joined by its hash when
    long enough to be told apart; a short one ("Done.") recurs across sessions and is not."""
    linker = SessionLinker(KEY)
    long_answer = ["x" * CROSS_SESSION_CHARS]
    sub = turn([{"role": "user", "content": "sub-agent task"}], streamed(long_answer), 1000, linker)
    short = turn([{"role": "user", "content": "other task"}], streamed(["Done."]), 1000, linker)
    opening = [{"role": "user", "content": "main task"}]
    root = turn(opening, streamed(["plan"]), 900, linker)
    results = [{"role": "tool", "content": long_answer[0]}, {"role": "tool", "content": "Done."}]
    join = turn(
        [*opening, {"role": "assistant", "content": "plan"}, *results], streamed(["ok"]), 1200, linker
    )
    assert join.parent_id == root.chat_id and join.join_ids == (sub.chat_id,) and join.session == root.session
    assert short.chat_id not in join.join_ids and join.tool_chars == len("Done.")
    assert join.turn == 1 and join.think_ns == 1200 * MS - (sub.offset_ns + sub.e2e_ns)  # both roots


def test_an_edited_answer_is_no_join_and_leaves_a_new_session() -> None:
    linker = SessionLinker(KEY)
    opening = [{"role": "user", "content": "q"}]
    turn(opening, streamed(["a0"]), 1000, linker)
    edited = [*opening, {"role": "assistant", "content": "a0 edited"}, {"role": "user", "content": "n"}]
    stray = turn(edited, streamed(["x"]), 1100, linker)
    assert (stray.turn, stray.think_ns, stray.join_ids) == (0, -1, ())


def test_a_join_quoting_an_empty_reply_and_two_identical_ones_names_each_branch() -> None:
    """Parallel calls whose replies are the same text, or empty (an end-of-sequence first), are still
    the join's distinct dependencies: each quoted message takes a reply no earlier one took."""
    linker = SessionLinker(KEY)
    opening = [{"role": "user", "content": "task"}]
    root = turn(opening, streamed(["plan"]), 1000, linker)
    context = [*opening, {"role": "assistant", "content": "plan"}]
    asks = [{"role": "user", "content": f"sub {j}"} for j in range(3)]
    replies = (["same"], ["same"], [])
    calls = [
        turn([*context, ask], streamed(tokens), 1100 + j, linker)
        for j, (ask, tokens) in enumerate(zip(asks, replies, strict=True))
    ]
    quotes = [
        m
        for ask, tokens in zip(asks, replies, strict=True)
        for m in (ask, {"role": "assistant", "content": "".join(tokens)})
    ]
    join = turn([*context, *quotes, {"role": "user", "content": "combine"}], streamed(["ok"]), 1200, linker)
    assert join.parent_id == calls[0].chat_id and join.session == root.session
    assert join.join_ids == (calls[1].chat_id, calls[2].chat_id) and join.turn == 2
