"""The tokenizer seam: every source gives the ids the target counts (checked against one BPE tokenizer)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from replayproxy.replay import calibrate, flavors, prompt_parts, tokenizer_setup
from replayproxy.replay.hf_tokenizer import LocalTokenizer
from replayproxy.replay.tokenizer import Chat, TokenizerError, engine_tokenizer
from replayproxy.sim.config import SimConfig
from replayproxy.sim.server import serving

CHATS = [
    Chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the river and the stone"}]
    ),
    Chat([{"role": "user", "content": "tools too"}], [flavors.DUMMY_TOOL]),
]
TEXTS = ["the river and the stone", "import os"]


@contextlib.asynccontextmanager
async def fake_engine(local: LocalTokenizer, token_ids: bool = True) -> AsyncIterator[str]:
    """llama.cpp's and TGI's tokenize endpoints over a local tokenizer; completions that may refuse ids."""

    async def apply_template(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"prompt": local.render(Chat(body["messages"], body.get("tools")))})

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        if "inputs" in body:  # TGI
            ids = local.encode_text_now([body["inputs"]], body.get("add_special_tokens", True))[0]
            return web.json_response([{"id": i, "text": "", "start": 0, "stop": 0} for i in ids])
        ids = local.encode_text_now([body["content"]], body.get("add_special", True))[0]
        return web.json_response({"tokens": ids})

    async def chat_tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        ids = local.encode_chat_now([Chat(body["messages"], body.get("tools"))])[0]
        return web.json_response({"tokenize_response": [{"id": i} for i in ids], "templated_text": ""})

    async def completions(request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        if isinstance(body["prompt"], list) and not token_ids:
            return web.json_response({"error": "token ids are not supported"}, status=500)
        return web.json_response({"choices": [{"text": "x"}], "usage": {"prompt_tokens": 1}})

    app = web.Application()
    app.router.add_post("/apply-template", apply_template)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/chat_tokenize", chat_tokenize)
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("flavor", ["llamacpp", "tgi"])
def test_llamacpp_and_tgi_endpoints_give_the_local_ids(bpe_tokenizer: Path, flavor: str) -> None:
    local = LocalTokenizer(bpe_tokenizer)

    async def main() -> tuple[list[list[int]], list[list[int]]]:
        async with fake_engine(local) as url, aiohttp.ClientSession() as session:
            tokenizer, why = await engine_tokenizer(flavor, session, url, "m", {})
            assert tokenizer is not None, why
            return await tokenizer.encode_chat(CHATS), await tokenizer.encode_text(TEXTS, special=False)

    chats, texts = asyncio.run(main())
    assert chats == local.encode_chat_now(CHATS)
    assert texts == local.encode_text_now(TEXTS, special=False)


def test_the_sims_tokenize_and_the_local_jinja_template_agree_on_every_id(bpe_tokenizer: Path) -> None:
    """vLLM's POST /tokenize as the sim answers it (its own ChatML) against the replayer's Jinja rendering."""
    local = LocalTokenizer(bpe_tokenizer)

    async def main() -> tuple[list[list[int]], list[list[int]], int, bytes]:
        config = SimConfig(port=0, tokenizer=str(bpe_tokenizer))
        async with serving(config) as url, aiohttp.ClientSession() as session:
            tokenizer, why = await engine_tokenizer("vllm", session, url, config.model, {})
            assert tokenizer is not None, why
            chats = await tokenizer.encode_chat(CHATS[:1])
            texts = await tokenizer.encode_text(TEXTS)
            body = {"model": config.model, "prompt": [local.vocab_size + 5], "max_tokens": 1}
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                return chats, texts, resp.status, await resp.read()

    chats, texts, status, answer = asyncio.run(main())
    assert chats == local.encode_chat_now(CHATS[:1]) and texts == local.encode_text_now(TEXTS)
    assert status == 400 and b"is out of vocabulary" in answer


def test_a_target_without_a_tokenize_endpoint_is_reported_not_raised() -> None:
    async def main() -> tuple[object, str, object, str]:
        async with serving(SimConfig(port=0)) as url, aiohttp.ClientSession() as session:
            none, why = await engine_tokenizer("openai", session, url, "m", {})
            wrong, missing = await engine_tokenizer("tgi", session, url, "m", {})
            return none, why, wrong, missing

    none, why, wrong, missing = asyncio.run(main())
    assert none is None and "no known tokenize endpoint" in why
    assert wrong is None and "404" in missing


def test_a_target_refusing_token_ids_gets_text_prompts(
    bpe_tokenizer: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local = LocalTokenizer(bpe_tokenizer)

    async def main(token_ids: bool) -> tuple[flavors.Flavor, dict[str, Any]]:
        async with fake_engine(local, token_ids) as url, aiohttp.ClientSession() as session:
            book = await prompt_parts.measure(local, [])
            prober = calibrate.Prober(session, url, flavors.get("llamacpp"), "m", {})
            return await tokenizer_setup.check_token_ids(prober, flavors.get("llamacpp"), book)

    refused, record = asyncio.run(main(False))
    assert not refused.token_id_prompts and record == {"token_id_prompts": "refused: sent as text"}
    assert "refuses token-id prompts" in caplog.text
    accepted, record = asyncio.run(main(True))
    assert accepted.token_id_prompts and record == {"token_id_prompts": "accepted"}


def test_a_missing_tokenizer_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="cannot load"):
        LocalTokenizer(tmp_path / "tokenizer.json")
