"""Multi-turn chat traffic with live replies, sent through a recording proxy to produce a real trace."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from tests.agents import streamed_content

TOPICS = ("rivers", "mountains", "trains", "gardens")


def _words(seed: int, count: int) -> str:
    vocabulary = "alpha beta gamma delta river stone light paper window garden market signal".split()
    return " ".join(
        vocabulary[(seed * 7 + i * 5) % len(vocabulary)] + str((seed + i) % 97) for i in range(count)
    )


async def _conversation(
    session: aiohttp.ClientSession, route: Callable[[], str], model: str, n: int, turns: int, echo: bool
) -> None:
    system = f"You answer questions about {TOPICS[n % len(TOPICS)]}. " + _words(n % len(TOPICS), 120)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for turn in range(turns):
        messages.append(
            {"role": "user", "content": f"Question {turn}: " + _words(n * 31 + turn, 40 + 9 * turn)}
        )
        body = {"model": model, "messages": messages, "max_tokens": 12, "stream": turn % 2 == 1}
        if body["stream"]:
            body["stream_options"] = {"include_usage": True}
        async with session.post(f"{route()}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            raw = await resp.read()
        if body["stream"]:
            reply = streamed_content(raw) if echo else "answer"
        else:
            reply = await _content(raw)
        messages.append({"role": "assistant", "content": reply})
        await asyncio.sleep(0.3)


async def _content(raw: bytes) -> str:
    import orjson

    return str(orjson.loads(raw)["choices"][0]["message"]["content"])


async def send(
    url: str | Sequence[str], model: str, conversations: int = 12, turns: int = 3, echo: bool = False
) -> None:
    """`conversations` conversations of `turns` turns, a few at a time, each turn after the last reply.
    Given several URLs, requests go to them in turn (a round-robin router: the turns of one
    conversation land on different proxies). With `echo`, a streamed reply is sent back as it
    came (as chat clients do), so every turn links to the reply before it."""
    urls = itertools.cycle([url] if isinstance(url, str) else url)
    route = urls.__next__
    async with aiohttp.ClientSession() as session:
        for first in range(0, conversations, 4):
            await asyncio.gather(
                *(
                    _conversation(session, route, model, n, turns, echo)
                    for n in range(first, min(first + 4, conversations))
                )
            )
