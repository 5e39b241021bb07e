"""What the target says about itself, and pre-run actions with their outcomes."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from replayproxy.replay import flavors, target
from replayproxy.sim.config import SimConfig
from replayproxy.sim.server import serving


def test_describe_and_pre_run_against_the_sim() -> None:
    async def main() -> tuple[target.TargetInfo, dict[str, str], dict[str, str]]:
        async with serving(SimConfig(port=0)) as url, aiohttp.ClientSession() as session:
            vllm = flavors.get("vllm")
            info = await target.describe(session, url, vllm, {})
            done = await target.pre_run(session, url, vllm, set(), {})
            skipped = await target.pre_run(session, url, vllm, {"reset_prefix_cache"}, {})
            return info, done, skipped

    info, done, skipped = asyncio.run(main())
    assert info.default_model == "sim-llama-3.1-8b" and info.engine_version
    assert done == {"reset_prefix_cache": "ok", "cache_start": "cold"}
    assert skipped == {"reset_prefix_cache": "skipped", "cache_start": "cache-warm"}


async def forbidden(request: web.Request) -> web.Response:
    return web.Response(status=401)


def test_unusable_targets_are_refused_with_a_reason() -> None:
    async def main() -> None:
        app = web.Application()
        app.router.add_get("/v1/models", forbidden)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession() as session:
                with pytest.raises(PermissionError, match="API key"):
                    await target.describe(session, url, flavors.get("openai"), {})
                outcome = await target.pre_run(session, url, flavors.get("sglang"), set(), {})
                assert outcome == {"flush_cache": "failed: HTTP 404", "cache_start": "cache-warm"}
                with pytest.raises(ConnectionError, match="cannot reach"):
                    await target.describe(session, "http://127.0.0.1:9", flavors.get("openai"), {})
        finally:
            await runner.cleanup()

    asyncio.run(main())
