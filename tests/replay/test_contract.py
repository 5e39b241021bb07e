"""What each engine publishes about its configuration, read from its documented endpoints."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from replayproxy.replay import contract
from replayproxy.results import RunContract

LLAMACPP_MODELS = {
    "object": "list",
    "data": [{"id": "tiny-llama", "owned_by": "llamacpp", "meta": {"n_ctx_train": 32768, "n_params": 5506304,
                                                                   "n_vocab": 8192, "ftype": "BF16"}}],
}  # fmt: skip


def _llamacpp_app(metrics: bool) -> web.Application:
    """llama-server's answers (build 11434), trimmed."""
    app = web.Application()
    props = {
        "default_generation_settings": {"n_ctx": 4096},
        "total_slots": 4,
        "model_path": "/models/tiny-llama-bf16.gguf",
        "model_ftype": "BF16",
        "build_info": "b11434-unknown",
    }
    slots = [{"id": i, "n_ctx": 4096, "is_processing": False} for i in range(4)]

    async def metrics_answer(_: web.Request) -> web.Response:
        if metrics:
            return web.Response(text="llamacpp:prompt_tokens_cached_total 0\n")
        return web.json_response({"error": {"code": 501, "message": "metrics disabled"}}, status=501)

    app.router.add_get("/props", _json(props))
    app.router.add_get("/slots", _json(slots))
    app.router.add_get("/metrics", metrics_answer)
    return app


def _tgi_app() -> web.Application:
    app = web.Application()
    info = {"model_id": "org/m", "model_dtype": "torch.float16", "max_input_tokens": 4095,
            "max_total_tokens": 4096, "max_concurrent_requests": 128, "version": "3.0.1"}  # fmt: skip
    app.router.add_get("/info", _json(info))
    return app


def _json(value: Any) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def answer(_: web.Request) -> web.Response:
        return web.json_response(value)

    return answer


def _collect(app: web.Application, models: Any = None) -> RunContract:
    async def main() -> RunContract:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return await contract.collect(f"http://127.0.0.1:{port}", models, {}, "", "")
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_llamacpp_props_slots_and_models_meta_fill_the_contract() -> None:
    found = _collect(_llamacpp_app(metrics=True), LLAMACPP_MODELS)
    assert found["engine_config"] == {
        "source": "/props",
        "model_file": "tiny-llama-bf16.gguf",  # the file name, not the server's directories
        "model_ftype": "BF16",
        "total_slots": 4,
        "n_ctx_per_slot": 4096,
        "metrics": "on",
        "n_ctx_train": 32768,
        "n_params": 5506304,
        "n_vocab": 8192,
        "ftype": "BF16",
    }
    assert found["max_model_len"] == 4096  # a request's context is its slot's


def test_llamacpp_without_metrics_says_how_to_turn_them_on() -> None:
    config = _collect(_llamacpp_app(metrics=False))["engine_config"]
    assert config["metrics"] == "off (start llama-server with --metrics)"


def test_tgi_info_fills_the_contract() -> None:
    found = _collect(_tgi_app())
    assert found["engine_config"]["source"] == "/info"
    assert found["engine_config"]["model_dtype"] == "torch.float16"
    assert found["max_model_len"] == 4096


def test_the_context_length_is_the_first_positive_number_the_engine_gave() -> None:
    vllm_models = {"data": [{"id": "m", "max_model_len": 8192}]}
    assert contract.context_length(vllm_models, {"n_ctx_per_slot": 4096}) == 8192
    assert contract.context_length(None, {"n_ctx_per_slot": 4096, "max_total_tokens": 2048}) == 4096
    # llama.cpp slots of different sizes give no one length; a TGI answer of another type is no length
    assert contract.context_length(None, {"n_ctx_per_slot": [2048, 4096], "max_total_tokens": 1024}) == 1024
    assert contract.context_length(None, {"n_ctx_per_slot": [2048, 4096], "max_total_tokens": "4k"}) is None
    assert contract.context_length(None, {"max_total_tokens": True}) is None
