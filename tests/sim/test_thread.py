"""The sim in a thread ends like a process: a request still in flight when the block ends leaves no
task pending, which the garbage collector would otherwise log into whatever test runs next."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging

import aiohttp
import pytest

from replayproxy.sim import SimConfig
from replayproxy.sim.thread import sim_thread
from tests.sim.helpers import chat_body


def test_a_request_in_flight_at_the_end_leaves_no_pending_task(caplog: pytest.LogCaptureFixture) -> None:
    async def send_and_give_up(url: str) -> None:
        async with aiohttp.ClientSession() as session:
            request = session.post(url + "/v1/chat/completions", json=chat_body(max_tokens=2))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.3):
                    await request  # the first byte comes only after 30 s

    with sim_thread(SimConfig(port=0, first_byte_delay=30.0)) as url:
        asyncio.run(send_and_give_up(url))
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
    assert not [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
