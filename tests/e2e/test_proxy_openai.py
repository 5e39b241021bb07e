"""The openai SDK gets the same answers through the proxy as straight from the engine (sync and async,
streamed and not), and the trace records every request with the engine's true token counts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from openai import AsyncOpenAI, OpenAI

from replayproxy.trace import load
from tests.servers import Server, sim, start_proxy
from tests.trace.helpers import shapes_in

MODEL = "sim-llama-3.1-8b"
PROMPTS = ["Tell me about rivers.", "Why is the sky blue? Explain twice.", "List three prime numbers."]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server, Path, Path]]:
    work = tmp_path_factory.mktemp("proxy-openai")
    truth, traces = work / "truth.jsonl", work / "traces"
    with (
        sim(
            "--speed", "20", "--truth-log", str(truth), "--reasoning-tokens", "2", "--no-prefix-cache"
        ) as engine,
        start_proxy(engine.url, traces) as proxy,
    ):
        yield engine, proxy, truth, traces


def chat_kwargs(prompt: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 12,
        "temperature": 0,
        **extra,
    }


def sync_answers(base: str) -> list[Any]:
    client = OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
    out: list[Any] = []
    for prompt in PROMPTS:
        chat = client.chat.completions.create(**chat_kwargs(prompt))
        out.append((chat.choices[0].message.content, chat.choices[0].finish_reason, chat.usage.model_dump()))
        stream = client.chat.completions.create(**chat_kwargs(prompt), stream=True)
        out.append(
            [
                (
                    c.choices[0].delta.content,
                    getattr(c.choices[0].delta, "reasoning_content", None),
                    c.choices[0].finish_reason,
                )
                if c.choices
                else "no-choices"
                for c in stream
            ]
        )
        asked = client.chat.completions.create(
            **chat_kwargs(prompt), stream=True, stream_options={"include_usage": True}
        )
        out.append([c.usage.model_dump() if c.usage else c.choices[0].delta.content for c in asked])
        text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=9, temperature=0)
        out.append((text.choices[0].text, text.usage.model_dump()))
    return out


async def async_answers(base: str) -> list[Any]:
    client = AsyncOpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
    out: list[Any] = []
    for prompt in PROMPTS:
        chat = await client.chat.completions.create(**chat_kwargs(prompt))
        out.append(chat.choices[0].message.content)
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=9, temperature=0, stream=True
        )
        out.append([c.choices[0].text async for c in stream])
    await client.close()
    return out


def test_openai_sdk_sees_identical_results_and_the_trace_matches_the_truth(
    servers: tuple[Server, Server, Path, Path],
) -> None:
    engine, proxy, truth, traces = servers
    direct_sync, proxied_sync = sync_answers(engine.url), sync_answers(proxy.url)
    assert proxied_sync == direct_sync
    assert any(isinstance(item, list) and len(item) > 5 for item in direct_sync)
    assert asyncio.run(async_answers(proxy.url)) == asyncio.run(async_answers(engine.url))
    truth.write_bytes(b"")  # from here on, every request goes through the proxy
    sent = len(sync_answers(proxy.url))  # one request per answer
    assert proxy.stop() == 0
    records = [orjson.loads(line) for line in truth.read_bytes().splitlines()]
    columns = load(traces)
    report = columns.report
    shapes = [s for s in shapes_in(columns) if s.offset_ns >= 0]
    assert report.footers >= 1 and not report.warnings
    recent = shapes[-len(records) :]
    assert len(records) == sent
    assert [(s.input_tokens, s.output_tokens, s.cached_tokens) for s in recent] == [
        (r["prompt_tokens"], r["completion_tokens"], r["cached_tokens"]) for r in records
    ]
    assert not any(s.output_estimated for s in recent)
    assert [s.endpoint for s in recent] == ["chat", "chat", "chat", "completions"] * len(PROMPTS)
    assert [s.stream for s in recent] == [False, True, True, False] * len(PROMPTS)
