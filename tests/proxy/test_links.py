"""Turn links at record time: each turn continues the reply it quotes, think time is exact, no text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from replayproxy import clock, trace
from replayproxy.proxy.extract import build_shape
from replayproxy.proxy.linker import SessionLinker
from replayproxy.proxy.prompt import PromptHasher
from replayproxy.shape import RequestShape
from replayproxy.trace import ReadReport, TraceHeader, write_trace
from replayproxy.trace.frames import iter_frame_payloads
from tests.proxy.test_extract import MS, capture, delta, event

KEY = b"k" * 32
SYSTEM = {"role": "system", "content": "You are terse."}


def streamed(tokens: list[str]) -> list[tuple[int, bytes]]:
    """A reply as an engine streams it: role chunk, one chunk per token, finish, [DONE]."""
    chunk = {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": None}]}
    reads = [(1, delta(role="assistant", content=""))]
    for i, token in enumerate(tokens):
        body = {**chunk, "choices": [{"index": 0, "delta": {"content": token}, "finish_reason": None}]}
        reads.append((2 + i, event(body)))
    reads.append((3 + len(tokens), b"data: [DONE]\n\n"))
    return reads


def turn(
    messages: list[dict[str, Any]],
    reply: list[tuple[int, bytes]],
    arrival_ms: int,
    linker: SessionLinker,
    hasher: PromptHasher | None = None,
) -> RequestShape:
    cap = capture("chat", {"model": "m", "stream": True, "messages": messages}, reply, event_stream=True)
    shift = (arrival_ms - 1000) * MS
    cap.arrival_ns += shift
    cap.piece_ns = [t + shift for t in cap.piece_ns]
    cap.end_ns += shift
    return build_shape(cap, hasher or PromptHasher(KEY), 0, linker)


def test_a_turn_continues_the_reply_it_quotes_with_its_think_time() -> None:
    linker = SessionLinker(KEY)
    opening = [SYSTEM, {"role": "user", "content": "hi"}]
    tokens = ["Hel", "lo ", "wörld", ' "q"\n', "\\"]
    first = turn(opening, streamed(tokens), 1000, linker)
    answer = {"role": "assistant", "content": "".join(tokens)}
    second = turn([*opening, answer, {"role": "user", "content": "more"}], streamed(["ok"]), 3000, linker)
    assert first.parent_id == 0 and first.chat_id != 0 and first.turn == 0 and first.think_ns == -1
    assert second.parent_id == first.chat_id and second.session == first.session != 0
    assert second.turn == 1 and second.think_ns == 3000 * MS - first.e2e_ns - 1000 * MS
    edited = {"role": "assistant", "content": "Hello wörld"}  # not what the proxy forwarded
    stray = turn([*opening, edited, {"role": "user", "content": "more"}], streamed(["x"]), 4000, linker)
    assert stray.session not in (0, first.session) and (stray.turn, stray.think_ns) == (0, -1)


def test_identical_openings_never_merge() -> None:
    """Two users send the same first turn: different replies, or the same reply, still two sessions."""
    linker = SessionLinker(KEY)
    opening = [SYSTEM, {"role": "user", "content": "hi"}]
    for replies in (["A", "B"], ["same", "same"]):
        a = turn(opening, streamed([replies[0]]), 1000, linker)
        b = turn(opening, streamed([replies[1]]), 1100, linker)
        assert a.session != b.session
        follow = [{"role": "user", "content": "next"}]
        a2 = turn([*opening, {"role": "assistant", "content": replies[0]}, *follow], [], 2000, linker)
        b2 = turn([*opening, {"role": "assistant", "content": replies[1]}, *follow], [], 2100, linker)
        assert {a2.session, b2.session} == {a.session, b.session} and a2.turn == b2.turn == 1


def test_tool_calls_link_and_tool_results_are_lengths() -> None:
    linker = SessionLinker(KEY)
    opening = [SYSTEM, {"role": "user", "content": "weather?"}]
    calls = [
        (1, delta(role="assistant", tool_calls=[{"index": 0, "id": "call_1", "type": "function",
                                                 "function": {"name": "get", "arguments": ""}}])),
        (2, delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city":'}}])),
        (3, delta(tool_calls=[{"index": 0, "function": {"arguments": '"Oslo"}'}}])),
        (4, b"data: [DONE]\n\n"),
    ]  # fmt: skip
    first = turn(opening, calls, 1000, linker)
    sent_back = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": '{"city":"Oslo"}'}}
        ],
    }
    result = {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}
    second = turn([*opening, sent_back, result], streamed(["Sunny."]), 1500, linker)
    assert second.parent_id == first.chat_id and (second.session, second.turn) == (first.session, 1)
    assert second.tool_chars == len("sunny, 21 C") and first.tool_chars == 0


def test_non_streamed_replies_link_and_cut_replies_do_not() -> None:
    linker = SessionLinker(KEY)
    opening = [{"role": "user", "content": "q"}]
    answer = orjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "A!"}}]})
    body = {"model": "m", "messages": opening}
    first = build_shape(capture("chat", body, [(5, answer)]), PromptHasher(KEY), 0, linker)
    follow = {
        "model": "m",
        "messages": [*opening, {"role": "assistant", "content": "A!"}, {"role": "user", "content": "?"}],
    }
    later = capture("chat", follow, [])
    later.arrival_ns += 2000 * MS
    second = build_shape(later, PromptHasher(KEY), 0, linker)
    assert (second.session, second.turn, second.think_ns) == (first.session, 1, 2000 * MS - 6 * MS)
    cut = turn(opening, streamed(["par"]), 1000, linker)
    cancelled = capture("chat", body, streamed(["x"]), event_stream=True, error="client_cancel")
    assert build_shape(cancelled, PromptHasher(KEY), 0, linker).chat_id == 0 and cut.chat_id != 0


def test_links_hold_no_text_and_depend_on_the_key(tmp_path: Path) -> None:
    opening = [SYSTEM, {"role": "user", "content": "secret question"}]
    shapes = [
        turn(opening, streamed(["secret answer"]), 1000, SessionLinker(k), PromptHasher(k))
        for k in (KEY, b"z" * 32)
    ]
    assert shapes[0].chat_id != shapes[1].chat_id and shapes[0].session != shapes[1].session
    path = tmp_path / "t.rpt"
    write_trace(path, TraceHeader(start_wall_ns=0), shapes, mono_ns=clock.now_ns, wall_ns=clock.wall_ns)
    stored = b"".join(bytes(p) for p in iter_frame_payloads(path.read_bytes(), str(path), ReadReport()))
    assert b"secret" not in stored and b"You are" not in stored and len(trace.load(path)) == 2


def test_the_linker_forgets_the_oldest_beyond_its_capacity() -> None:
    linker = SessionLinker(KEY, capacity=2)
    opening = [{"role": "user", "content": "q"}]
    firsts = [turn(opening, streamed([f"r{i}"]), 1000 + i, linker) for i in range(3)]

    def follow(i: int) -> RequestShape:
        messages = [*opening, {"role": "assistant", "content": f"r{i}"}, {"role": "user", "content": "n"}]
        return turn(messages, [], 2000, linker)

    newest, oldest = follow(2), follow(0)
    assert (newest.session, newest.turn) == (firsts[2].session, 1) and oldest.turn == 0
