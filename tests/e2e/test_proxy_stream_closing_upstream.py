"""An upstream that closes the connection right after each streamed response while advertising
keep-alive (a default llama-server; the sim's --close-after-stream): the proxy must never write the
next request into that closing connection, where it would be lost and, at most once, answered 502."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from tests.replay.traces import SIM_MODEL
from tests.servers import sim, start_proxy
from tests.trace.helpers import shapes_of

REQUESTS = 40


async def _sequential_streams(url: str) -> list[int]:
    statuses = []
    connector = aiohttp.TCPConnector(limit=1)  # one client connection: every request right after the last
    async with aiohttp.ClientSession(connector=connector) as session:
        for n in range(REQUESTS):
            body = {
                "model": SIM_MODEL,
                "stream": True,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": f"q{n}"}],
            }
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                text = await resp.read()
                statuses.append(resp.status if b"data: [DONE]" in text else -resp.status)
    return statuses


def test_streams_back_to_back_through_an_upstream_that_closes_after_each(tmp_path: Path) -> None:
    with sim("--speed", "50", "--close-after-stream") as engine, start_proxy(engine.url, tmp_path) as proxy:
        statuses = asyncio.run(_sequential_streams(proxy.url))
        assert proxy.stop() == 0
    assert statuses == [200] * REQUESTS
    recorded = shapes_of(tmp_path)
    assert len(recorded) == REQUESTS and all(s.error == "" and s.status == 200 for s in recorded)
