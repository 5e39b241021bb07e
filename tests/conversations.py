"""Multi-turn chat traffic with live replies, sent through a recording proxy to produce a real trace."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

TOPICS = ("rivers", "mountains", "trains", "gardens")


def _words(seed: int, count: int) -> str:
    vocabulary = "alpha beta gamma delta river stone light paper window garden market signal".split()
    return " ".join(
        vocabulary[(seed * 7 + i * 5) % len(vocabulary)] + str((seed + i) % 97) for i in range(count)
    )


async def _conversation(session: aiohttp.ClientSession, url: str, model: str, n: int, turns: int) -> None:
    system = f"You answer questions about {TOPICS[n % len(TOPICS)]}. " + _words(n % len(TOPICS), 120)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for turn in range(turns):
        messages.append(
            {"role": "user", "content": f"Question {turn}: " + _words(n * 31 + turn, 40 + 9 * turn)}
        )
        body = {"model": model, "messages": messages, "max_tokens": 12, "stream": turn % 2 == 1}
        if body["stream"]:
            body["stream_options"] = {"include_usage": True}
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            raw = await resp.read()
        reply = "answer" if body["stream"] else (await _content(raw))
        messages.append({"role": "assistant", "content": reply})
        await asyncio.sleep(0.3)


async def _content(raw: bytes) -> str:
    import orjson

    return str(orjson.loads(raw)["choices"][0]["message"]["content"])


async def send(url: str, model: str, conversations: int = 12, turns: int = 3) -> None:
    """`conversations` conversations of `turns` turns, a few at a time, each turn after the last reply."""
    async with aiohttp.ClientSession() as session:
        for first in range(0, conversations, 4):
            await asyncio.gather(
                *(
                    _conversation(session, url, model, n, turns)
                    for n in range(first, min(first + 4, conversations))
                )
            )
