"""Answers read from OpenAI chat and completion bodies, and failures mapped to error classes."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from replayproxy.check.client import UNKNOWN, Answer, parse_answer, send
from replayproxy.sim import SimConfig
from replayproxy.sim.thread import sim_thread


def test_chat_completion_and_tool_calls() -> None:
    chat = {
        "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2},
    }
    answer = parse_answer(chat, 200, 10)
    assert (answer.text, answer.finish_reason, answer.prompt_tokens, answer.completion_tokens) == (
        "hi",
        "stop",
        5,
        2,
    )
    call = {
        "choices": [
            {
                "message": {
                    "content": None,
                    "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    answer = parse_answer(call, 200, 10)
    assert (
        answer.text == "" and answer.tool_calls[0].name == "f" and answer.tool_calls[0].arguments == '{"a":1}'
    )
    assert answer.prompt_tokens == UNKNOWN  # no usage: unknown, not zero
    completion = parse_answer({"choices": [{"text": "abc", "finish_reason": "length"}]}, 200, 1)
    assert completion.text == "abc" and completion.finish_reason == "length"
    for bad in ({}, {"choices": []}, {"choices": [{"message": {"content": 5}}]}):
        with pytest.raises(ValueError):
            parse_answer(bad, 200, 1)


async def _send(url: str, body: dict[str, object]) -> Answer:
    async with aiohttp.ClientSession() as session:
        return await send(session, url, body, {}, 10.0)


def test_errors_are_classified_without_text() -> None:
    with sim_thread(SimConfig(port=0, speed=50)) as url:
        wrong_model = asyncio.run(
            _send(
                url + "/v1/chat/completions",
                {"model": "nope", "messages": [{"role": "user", "content": "secret words"}]},
            )
        )
        ok = asyncio.run(
            _send(
                url + "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3},
            )
        )
    assert wrong_model.error == "http_4xx" and wrong_model.status == 404
    assert "secret" not in wrong_model.error_message and "NotFoundError" in wrong_model.error_message
    assert ok.ok and ok.completion_tokens == 3
    refused = asyncio.run(_send("http://127.0.0.1:9/v1/chat/completions", {}))
    assert refused.error == "connect"
