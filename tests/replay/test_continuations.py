"""Closed-loop rewrites made in arrival order: ids asked for, live sharing, edited-reply followers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from replayproxy.replay import continuations, flavors, plan
from replayproxy.replay.prepared import Prepared
from replayproxy.shape import RequestShape
from replayproxy.trace import Columns, load
from tests.e2e.test_replay_sessions import session_shapes
from tests.replay import traces

S = 1_000_000_000


def _prepared(
    index: int, prompt: Any, expected_in: int, after: int = -1, out: int = 8, session: int = 1
) -> Prepared:
    body = orjson.dumps({"model": "m", "messages": prompt})
    return Prepared(
        index=index, scheduled_ns=0, endpoint="chat", path="/v1/chat/completions", body=body, stream=False,
        expected_input_tokens=expected_in, expected_output_tokens=out, after=after, session=session,
    )  # fmt: skip


def _cols(tmp_path: Path, count: int) -> Columns:
    shapes = [RequestShape(offset_ns=i * S, e2e_ns=S // 2) for i in range(count)]  # each ended 0.5 s later
    return load(traces.write(tmp_path / "t.rpt", shapes))


def _rewritten(cols: Columns, prepared: list[Prepared], speed: float, live: bool = True) -> list[Prepared]:
    """The requests as the planner hands them on, one at a time in arrival order."""
    index = np.array([p.index for p in prepared], np.int64)
    after = np.array([p.after for p in prepared], np.int64)
    sessions = continuations.Continuations(cols, index, after, speed, live=live, token_ids=True)
    return [sessions.rewrite(p, orjson.loads(p.body)["messages"]) for p in prepared]


def test_implied_sharing_counts_the_reply_but_its_last_token(tmp_path: Path) -> None:
    first = _prepared(0, [], 100, out=30)
    second = _prepared(1, [], 200, after=0)
    lone = _prepared(2, [], 50, session=2)
    shared = [p.expected_shared_tokens for p in _rewritten(_cols(tmp_path, 3), [first, second, lone], 1.0)]
    assert shared == [0, 129, 0]
    planned = _rewritten(_cols(tmp_path, 3), [first, second, lone], 1.0, live=False)
    assert [p.expected_shared_tokens for p in planned] == [0, 0, 0]  # replies as planned: as the trace says


def test_a_request_extending_a_live_turn_with_an_edited_reply_follows_that_turn(tmp_path: Path) -> None:
    """The proxy links by the reply sent back, so a client that edits it starts a new session; its
    messages still extend the live turn's conversation, so it waits for that turn and shares it."""
    cols = _cols(tmp_path, 4)
    system, user = {"role": "system", "content": "alpha beta"}, {"role": "user", "content": "gamma delta"}
    first = _prepared(0, [system, user], 20)
    reply = {"role": "assistant", "content": "x"}
    live = replace(_prepared(1, [system, user, reply, user], 40, after=0), first=0)
    edited = [system, user, {"role": "assistant", "content": "x"}, {"role": "user", "content": "gamma"},
              {"role": "assistant", "content": "edited"}, user]  # fmt: skip
    follower = replace(_prepared(2, edited, 60, session=5), expected_shared_tokens=30)
    other = [system, {"role": "user", "content": "other"}, *edited[2:]]
    stranger = replace(_prepared(3, other, 60, session=6), expected_shared_tokens=4)
    out = _rewritten(cols, [first, live, follower, stranger], speed=2.0)
    # waits for turn 1 (the recorded gap at speed 2), stays with its session, shares its whole prompt
    assert (out[2].after, out[2].think_ns, out[2].first, out[2].expected_shared_tokens) == (1, S // 4, 0, 40)
    assert continuations.is_follower(out[2], out[1]) and not continuations.is_follower(out[1], out[0])
    assert out[3] == stranger and out[0] == first and out[1].after == 0
    # a follower never links to a turn planned after it: the same request first finds no leader
    alone = _rewritten(cols, [first, replace(follower, index=1), replace(live, index=2)], speed=2.0)
    assert alone[1].after == -1


def test_the_planner_asks_for_ids_only_for_continued_turns_with_live_replies(tmp_path: Path) -> None:
    cols = load(traces.write(tmp_path / "sessions.rpt", session_shapes(sessions=6, turns=3)))
    rows = np.arange(len(cols))
    vllm = flavors.get("vllm")
    closed = plan.PlanOptions(seed=3, closed_loop=True, live_replies=True)
    live = plan.prepare(cols, rows, vllm, closed)
    continued = {p.after for p in live if p.after >= 0}
    assert continued  # the trace has sessions
    asks = {p.index for p in live if orjson.loads(p.body).get("return_token_ids") is True}
    assert asks == continued
    openai = plan.prepare(cols, rows, flavors.get("openai"), closed)
    planned = plan.prepare(cols, rows, vllm, replace(closed, live_replies=False))
    assert not any(b"return_token_ids" in p.body for p in [*openai, *planned])
    # otherwise the bodies are the open-loop ones
    open_loop = plan.prepare(cols, rows, vllm, plan.PlanOptions(seed=3))
    assert [p.body for p in planned] == [p.body for p in open_loop]
    strip = [
        orjson.dumps({k: v for k, v in orjson.loads(p.body).items() if k != "return_token_ids"}) for p in live
    ]
    assert strip == [p.body for p in open_loop]
