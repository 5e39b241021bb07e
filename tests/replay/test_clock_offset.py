"""The clock offset a shard records: measured against a real HTTP server whose `Date` is off by a
known amount, the estimate lands within its bound of the truth; contradicting clocks give none."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from email.utils import formatdate

import aiohttp
import pytest
from aiohttp import web

from replayproxy import clock
from replayproxy.replay.clock_offset import against_date

pytestmark = pytest.mark.timeout(60)


async def _measure(date_of: Callable[[], float]) -> dict[str, int] | None:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": []}, headers={"Date": formatdate(date_of(), usegmt=True)})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as http:
            return await against_date(http, f"http://127.0.0.1:{port}/v1/models", {})
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("behind_s", [0.0, 2.37, -0.61])
def test_the_offset_against_the_targets_date_is_within_its_bound(behind_s: float) -> None:
    found = asyncio.run(_measure(lambda: clock.wall_ns() / 1e9 - behind_s))
    assert found is not None and found["probes"] == 6
    assert found["bound_ns"] < 150_000_000  # six probes: from 1 s to well under it
    assert abs(found["offset_ns"] - behind_s * 1e9) <= found["bound_ns"] + 20_000_000, found


def test_two_clocks_behind_one_address_give_no_offset() -> None:
    replicas = itertools.cycle([0.0, 5.0])  # a load balancer alternating between two replicas
    assert asyncio.run(_measure(lambda: clock.wall_ns() / 1e9 - next(replicas))) is None
