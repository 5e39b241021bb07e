"""Calibration against servers with known templates: the sim's, and one that injects a system prompt."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from replayproxy.replay import calibrate, flavors, synth
from replayproxy.replay.prepared import Prepared
from replayproxy.sim.config import SimConfig
from replayproxy.sim.server import serving

KEYS: Counter[tuple[tuple[str, ...], bool]] = Counter(
    {(("system", "user"), False): 5, (("user",), False): 3, (("user",), True): 1}
)


async def probe(
    url: str, keys: Counter[tuple[tuple[str, ...], bool]]
) -> tuple[synth.Template, calibrate.Prober]:
    async with aiohttp.ClientSession() as session:
        prober = calibrate.Prober(session, url, flavors.get("vllm"), "sim-llama-3.1-8b", {})
        template, report = await calibrate.chat_template(prober, keys)
        assert report["exact_keys"] == len(keys)
        return template, prober


def test_the_sims_template_is_measured_exactly() -> None:
    async def main() -> synth.Template:
        async with serving(SimConfig(port=0, speed=20)) as url:
            template, _ = await probe(url, KEYS)
            return template

    template = asyncio.run(main())
    assert (template.fixed_tokens, template.per_message_tokens, template.tokens_per_word) == (4, 4, 1.0)
    assert template.overhead("system,user", 2) == 12 and template.overhead("user+tools", 1) == 8


class OddTemplate:
    """A template that adds a 25-token default system prompt when none is given (Llama 3.1 does
    something like it), 3 tokens per message and 2 per request; tools cost 40 more. The first
    answer is a 500, to check that probes retry."""

    def __init__(self) -> None:
        self.calls = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.calls += 1
        if self.calls == 1:
            return web.json_response({"error": {"message": "warming up"}}, status=500)
        body: dict[str, Any] = orjson.loads(await request.read())
        roles = [m["role"] for m in body["messages"]]
        words = sum(len(m["content"].split()) for m in body["messages"])
        tokens = (
            2 + 3 * len(roles) + words + (0 if "system" in roles else 25) + (40 if body.get("tools") else 0)
        )
        return web.json_response({"choices": [], "usage": {"prompt_tokens": tokens, "completion_tokens": 1}})


def test_exact_overheads_correct_the_linear_fit_and_5xx_is_retried() -> None:
    odd = OddTemplate()

    async def main() -> tuple[synth.Template, int]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", odd.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            template, prober = await probe(f"http://127.0.0.1:{runner.addresses[0][1]}", KEYS)
            return template, prober.probes
        finally:
            await runner.cleanup()

    template, probes = asyncio.run(main())
    assert template.tokens_per_word == 1.0
    assert template.overhead("system,user", 2) == 2 + 6  # no default system prompt here
    assert template.overhead("user", 1) == 2 + 3 + 25
    assert template.overhead("user+tools", 1) == 2 + 3 + 25 + 40
    assert probes == 3 + len(KEYS) + 1  # three fit probes, one per key, one retry


def test_verify_counts_exact_prompts() -> None:
    async def main() -> dict[str, int]:
        async with serving(SimConfig(port=0, speed=20)) as url, aiohttp.ClientSession() as session:
            prober = calibrate.Prober(session, url, flavors.get("vllm"), "sim-llama-3.1-8b", {})
            words = " ".join(["the"] * 10)
            messages = [{"role": "user", "content": words}]
            body = orjson.dumps(
                {"model": "sim-llama-3.1-8b", "messages": messages, "max_tokens": 5, "stream": True}
            )
            right = Prepared(0, 0, "chat", "/v1/chat/completions", body, True, 18, 5)
            wrong = Prepared(1, 0, "chat", "/v1/chat/completions", body, True, 17, 5)
            return await calibrate.verify(prober, [right, wrong])

    assert asyncio.run(main()) == {"checked": 2, "exact": 1}


async def no_usage(request: web.Request) -> web.Response:
    return web.json_response({"choices": []})


def test_a_target_without_usage_cannot_be_calibrated() -> None:
    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", no_usage)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            await probe(f"http://127.0.0.1:{runner.addresses[0][1]}", KEYS)
        finally:
            await runner.cleanup()

    with pytest.raises(calibrate.CalibrationError, match="no-calibrate"):
        asyncio.run(main())
