"""Agent-shaped chat traffic with live replies: a root call, then steps that fan out parallel calls
continuing the context and join their answers, sent through a recording proxy. Each request carries
a unique `seed` (a sampling value the trace keeps), so a test finds every request in the trace and
compares the recorded graph with the one sent (`Sent`)."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

MODEL = "sim-llama-3.1-8b"


@dataclass(frozen=True)
class Step:
    fan_out: int  # parallel calls, each continuing the current context with its own sub-task
    quoted: bool  # the join quotes the answers as user/assistant pairs; else returns them as tool results
    branch_waits_ms: tuple[float, ...]  # each call's wait after the step's base reply ended
    tool_wait_ms: float  # the join's wait after the last call ended


@dataclass(frozen=True)
class AgentSession:
    start_ms: float
    steps: tuple[Step, ...]


@dataclass
class Sent:
    """One request as the client sent it, with the graph it belongs to."""

    tag: int
    session: int
    parent: int | None  # the tag of the request whose context it continues
    joins: tuple[int, ...]  # tags of the other requests whose answers it quotes
    depth: int
    waited_ms: float = -1.0  # the client's time from the last dependency's end to this send
    end: float = 0.0  # perf_counter when its reply was read
    e2e_ms: float = 0.0


def random_sessions(
    rng: random.Random, count: int, max_fan_out: int = 8, max_depth: int = 5
) -> list[AgentSession]:
    """Sessions with fan-outs 1..max_fan_out and depths 1..max_depth; tool waits drawn log-normal
    (median 20 ms, a long tail clipped at 400 ms: most tools answer fast, a few take long)."""

    def wait() -> float:
        return min(400.0, rng.lognormvariate(3.0, 0.9))

    sessions = []
    for n in range(count):
        steps = tuple(
            Step(
                fan_out=(fan := rng.randint(1, max_fan_out)),
                quoted=rng.random() < 0.5,
                branch_waits_ms=tuple(rng.uniform(0, 30) for _ in range(fan)),
                tool_wait_ms=wait(),
            )
            for _ in range(rng.randint(1, max_depth))
        )
        sessions.append(AgentSession(start_ms=n * rng.uniform(20, 120), steps=steps))
    return sessions


def _words(seed: int, count: int) -> str:
    vocabulary = "alpha beta gamma delta river stone light paper window garden market signal".split()
    return " ".join(
        vocabulary[(seed * 7 + i * 5) % len(vocabulary)] + str((seed + i) % 97) for i in range(count)
    )


@dataclass
class AgentClient:
    """Sends sessions to `url` (a proxy) and notes every request sent."""

    url: str
    sent: list[Sent] = field(default_factory=list)
    max_tokens: int = 16
    _tags: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def run(self, sessions: list[AgentSession]) -> list[Sent]:
        """Every session, each starting at its start time (open loop), its requests closed loop."""
        async with aiohttp.ClientSession() as http:
            origin = time.perf_counter()
            await asyncio.gather(*(self._session(http, n, s, origin) for n, s in enumerate(sessions)))
        return self.sent

    async def _session(self, http: aiohttp.ClientSession, n: int, spec: AgentSession, origin: float) -> None:
        await asyncio.sleep(max(0.0, origin + spec.start_ms / 1e3 - time.perf_counter()))
        context: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent. " + _words(n % 5, 60)},
            {"role": "user", "content": f"Task {n}: " + _words(n * 13, 30)},
        ]
        base, reply = await self._call(http, n, context, None, (), 0, 0.0)
        for s, step in enumerate(spec.steps):
            context = [*context, {"role": "assistant", "content": reply}]

            answers = await asyncio.gather(
                *(self._branch(http, n, s, j, step, base, context) for j in range(step.fan_out))
            )
            await asyncio.sleep(step.tool_wait_ms / 1e3)
            last_end = max(a.end for a, _ in answers)
            if step.quoted:  # continues the first call's context, quoting the others' answers
                quoted = []
                for j, (_, text) in enumerate(answers):
                    ask = {
                        "role": "user",
                        "content": f"Sub-task {s}.{j}: " + _words(n * 101 + s * 11 + j, 12),
                    }
                    quoted += [ask, {"role": "assistant", "content": text}]
                context = [*context, *quoted, {"role": "user", "content": "Combine the answers."}]
                parent, joins = answers[0][0], tuple(a.tag for a, _ in answers[1:])
            else:  # continues the base's context, the answers returned as tool results
                context = [*context, *({"role": "tool", "content": text} for _, text in answers)]
                parent, joins = base, tuple(a.tag for a, _ in answers)
            depth = max(a.depth for a, _ in answers) + 1
            base, reply = await self._call(http, n, context, parent, joins, depth, last_end)

    async def _branch(
        self,
        http: aiohttp.ClientSession,
        n: int,
        s: int,
        j: int,
        step: Step,
        base: Sent,
        context: list[dict[str, Any]],
    ) -> tuple[Sent, str]:
        await asyncio.sleep(step.branch_waits_ms[j] / 1e3)
        ask = {"role": "user", "content": f"Sub-task {s}.{j}: " + _words(n * 101 + s * 11 + j, 12)}
        return await self._call(http, n, [*context, ask], base, (), base.depth + 1, base.end)

    async def _call(
        self,
        http: aiohttp.ClientSession,
        session: int,
        messages: list[dict[str, Any]],
        parent: Sent | None,
        joins: tuple[int, ...],
        depth: int,
        after: float,
    ) -> tuple[Sent, str]:
        tag = next(self._tags)
        stream = tag % 2 == 0
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "seed": tag,
            "stream": stream,
        }
        sent_at = time.perf_counter()
        request = Sent(tag, session, None if parent is None else parent.tag, joins, depth)
        request.waited_ms = (sent_at - after) * 1e3 if parent is not None else -1.0
        async with http.post(f"{self.url}/v1/chat/completions", json=body) as resp:
            raw = await resp.read()
            assert resp.status == 200, raw[:200]
        request.end = time.perf_counter()
        request.e2e_ms = (request.end - sent_at) * 1e3
        self.sent.append(request)
        return request, streamed_content(raw) if stream else str(
            orjson.loads(raw)["choices"][0]["message"]["content"]
        )


def streamed_content(raw: bytes) -> str:
    parts = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            choices = orjson.loads(line[6:]).get("choices") or [{}]
            parts.append((choices[0].get("delta") or {}).get("content") or "")
    return "".join(parts)


def check_recorded_graph(columns: Any, sent: list[Sent], think_slack_ms: float = 250.0) -> None:
    """Every request sent is in the trace (found by its seed) with exactly the graph it was sent
    with: its parent, its joins in the order it quotes them, its depth, one session per agent
    session and none shared; its think time is the client's wait (within `think_slack_ms`)."""
    row_of = {int(s["seed"]): i for i, s in enumerate(columns.sampling.tolist()) if "seed" in s}
    assert sorted(row_of) == sorted(r.tag for r in sent), "requests missing from the trace"
    chat = {r.tag: int(columns.chat_id[row_of[r.tag]]) for r in sent}
    sessions: dict[int, set[int]] = {}
    for r in sent:
        row = row_of[r.tag]
        assert chat[r.tag] != 0, r
        parent_id = int(columns.parent_id[row])
        assert parent_id == (0 if r.parent is None else chat[r.parent]), r
        assert [int(j) for j in columns.joins_of(row)] == [chat[j] for j in r.joins], r
        assert int(columns.turn[row]) == r.depth, r
        assert not columns.spawned[row]
        think_ms = int(columns.think_ns[row]) / 1e6
        if r.parent is None:
            assert think_ms < 0, r
        else:
            assert abs(think_ms - r.waited_ms) <= think_slack_ms, (r, think_ms)
        sessions.setdefault(r.session, set()).add(int(columns.session[row]))
    assert all(len(ids) == 1 for ids in sessions.values()), sessions
    assert len({next(iter(ids)) for ids in sessions.values()}) == len(sessions)
