"""Agent sessions recorded through the real proxy in front of the sim: parallel calls that continue
an earlier turn (branches), calls that quote several answers (joins) and tool waits come back as
the exact graph the client sent, by keyed hashes only."""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path
from typing import Any

import pytest

from replayproxy import trace
from replayproxy.cli import main
from replayproxy.trace import ReadReport
from replayproxy.trace.frames import iter_frame_payloads
from tests.agents import MODEL, AgentClient, AgentSession, Step, check_recorded_graph, random_sessions
from tests.servers import sim, start_proxy

pytestmark = pytest.mark.slow


def record(tmp_path: Path, sessions: list[AgentSession]) -> tuple[Any, list[Any]]:
    with sim("--speed", "10") as engine, start_proxy(engine.url, tmp_path / "traces") as proxy:
        sent = asyncio.run(AgentClient(proxy.url).run(sessions))
        assert proxy.stop() == 0
    return trace.load(sorted((tmp_path / "traces").glob("*.rpt"))), sent


def test_random_agent_sessions_come_back_as_the_graph_sent(tmp_path: Path) -> None:
    rng = random.Random(38)
    widest = AgentSession(0, tuple(Step(f, f % 2 == 0, (0.0,) * f, 5.0) for f in (8, 1, 3, 5, 2)))
    sessions = [widest, *random_sessions(rng, 6), AgentSession(10, (Step(1, False, (0.0,), 30.0),))]
    columns, sent = record(tmp_path, sessions)
    assert {len(r.joins) for r in sent} >= {0, 7} and max(r.depth for r in sent) == 10
    check_recorded_graph(columns, sent)


def test_parallel_sub_agent_calls_and_their_join_make_one_session_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A root call, 3 parallel calls continuing its context, a join quoting all three answers, through
    the openai SDK, 4 sessions: 4 sessions recorded, the calls are branches of the root, the join
    waits for all three."""
    from openai import AsyncOpenAI

    async def session(client: AsyncOpenAI, n: int) -> None:
        async def ask(messages: list[Any]) -> str:
            reply = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=16, seed=n
            )
            return reply.choices[0].message.content or ""

        context: list[Any] = [
            {"role": "system", "content": "You plan work and delegate it."},
            {"role": "user", "content": f"Refactor module {n} of the billing service."},
        ]
        context.append({"role": "assistant", "content": await ask(context)})
        tasks = [
            {"role": "user", "content": f"Sub-agent {j}: handle part {j} of module {n}."} for j in range(3)
        ]
        answers = await asyncio.gather(*(ask([*context, task]) for task in tasks))
        quoted = [
            m
            for task, a in zip(tasks, answers, strict=True)
            for m in (task, {"role": "assistant", "content": a})
        ]
        await ask([*context, *quoted, {"role": "user", "content": "Merge the three results."}])

    async def traffic(url: str) -> None:
        async with AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
            await asyncio.gather(*(session(client, n) for n in range(4)))

    with sim("--speed", "2") as engine, start_proxy(engine.url, tmp_path / "traces") as proxy:
        asyncio.run(traffic(proxy.url))
        assert proxy.stop() == 0
    paths = sorted((tmp_path / "traces").glob("*.rpt"))
    columns = trace.load(paths)
    assert len(columns) == 20 and len(set(columns.session.tolist())) == 4
    assert sorted(columns.turn.tolist()) == [0] * 4 + [1] * 12 + [2] * 4
    chat_row = {int(c): i for i, c in enumerate(columns.chat_id.tolist())}
    for row in map(int, (columns.turn == 2).nonzero()[0]):
        deps = [chat_row[int(columns.parent_id[row])], *(chat_row[int(j)] for j in columns.joins_of(row))]
        assert len(deps) == 3 and all(columns.turn[d] == 1 for d in deps)
        assert {int(columns.session[d]) for d in deps} == {int(columns.session[row])}
        ends = [int(columns.offset_ns[d] + columns.e2e_ns[d]) for d in deps]
        assert int(columns.think_ns[row]) == int(columns.offset_ns[row]) - max(ends)
    stored = b"".join(
        bytes(p) for path in paths for p in iter_frame_payloads(path.read_bytes(), str(path), ReadReport())
    )
    assert b"billing service" not in stored and b"handle part" not in stored and b"Merge the" not in stored
    assert main(["inspect", *map(str, paths)]) == 0
    assert re.search(r"^sessions +4$", capsys.readouterr().out, re.M)
