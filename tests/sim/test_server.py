"""The OpenAI API end to end on a real loopback server, with the openai SDK and raw HTTP."""

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionChunk

from tests.sim.conftest import RunningSim
from tests.sim.helpers import MODEL, chat_body, first_content_ns, get, metric, post, read_truth

StartSim = Callable[..., RunningSim]
FAST = {"speed": 20.0}


def _client(sim: RunningSim) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0)


def _stream_chat(
    client: openai.OpenAI, content: str, max_tokens: int, stream_options: Any = openai.NOT_GIVEN
) -> list[ChatCompletionChunk]:
    """The chunks of a streamed chat request of one user message, generated to `max_tokens`."""
    return list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": content}],
            max_tokens=max_tokens,
            stream=True,
            stream_options=stream_options,
            extra_body={"ignore_eos": True},
        )
    )


def test_models_health_version(start_sim: StartSim) -> None:
    sim = start_sim(**FAST)
    with _client(sim) as client:
        assert [m.id for m in client.models.list()] == [MODEL]
    assert get(sim.url + "/health")[0] == 200
    status, body = get(sim.url + "/version")
    assert status == 200 and "version" in orjson.loads(body)


def test_sync_chat_non_streaming(start_sim: StartSim) -> None:
    sim = start_sim(**FAST)
    with _client(sim) as client:
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=12,
            seed=3,
            extra_body={"ignore_eos": True},
        )
        again = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=12,
            seed=3,
            extra_body={"ignore_eos": True},
        )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    assert reply.usage.prompt_tokens == 4 + 4 + 5  # template overhead + "Tell me a story."
    assert reply.choices[0].message.content == again.choices[0].message.content
    [record, _] = read_truth(sim.truth, 2)
    assert record["id"] == reply.id and record["kinds"] == "b" and record["completion_tokens"] == 12


def test_sync_chat_stream_role_first_then_content_then_usage(start_sim: StartSim) -> None:
    sim = start_sim(**FAST)
    with _client(sim) as client:
        chunks = _stream_chat(client, "hi", 6, {"include_usage": True})
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    content = [c for c in chunks[1:] if c.choices]
    assert len(content) == 6 and all(c.choices[0].delta.content for c in content)
    assert [c.choices[0].finish_reason for c in content] == [None] * 5 + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens_details is not None
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    [record] = read_truth(sim.truth, 1)
    assert record["kinds"] == "r" + "c" * 6 + "ud" and len(record["chunk_ns"]) == 9
    assert record["arrival_ns"] <= record["chunk_ns"][0] <= record["chunk_ns"][-1]


def test_async_completions_stream_and_not(start_sim: StartSim) -> None:
    sim = start_sim(**FAST)

    async def scenario() -> tuple[list[str], str, int]:
        async with openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0) as client:
            stream = await client.completions.create(
                model=MODEL, prompt=[1, 2, 3, 4], max_tokens=5, stream=True, extra_body={"ignore_eos": True}
            )
            texts = [c.choices[0].text async for c in stream]
            whole = await client.completions.create(
                model=MODEL, prompt="one two three", max_tokens=5, extra_body={"ignore_eos": True}
            )
            assert whole.usage is not None
            return texts, whole.choices[0].text, whole.usage.prompt_tokens

    texts, text, prompt_tokens = asyncio.run(scenario())
    assert len(texts) == 5 and all(texts)
    assert len(text.split()) == 5 and prompt_tokens == 4  # BOS + three words
    records = read_truth(sim.truth, 2)
    assert [r["prompt_tokens"] for r in records] == [4, 4]
    assert records[0]["kinds"] == "c" * 5 + "d"


def test_without_ignore_eos_lengths_vary_and_end_with_stop(start_sim: StartSim) -> None:
    sim = start_sim(mean_output_tokens=8, **FAST)
    with _client(sim) as client:
        replies = [client.completions.create(model=MODEL, prompt="go", max_tokens=200) for _ in range(12)]
    lengths = {r.usage.completion_tokens for r in replies if r.usage}
    assert len(lengths) > 2 and max(lengths) < 200
    assert {r.choices[0].finish_reason for r in replies} == {"stop"}


def test_continuous_usage_reasoning_and_several_tokens_per_chunk(start_sim: StartSim) -> None:
    sim = start_sim(tokens_per_chunk=3, reasoning_tokens=4, **FAST)
    with _client(sim) as client:
        chunks = _stream_chat(client, "think", 10, {"include_usage": True, "continuous_usage_stats": True})
    assert all(c.usage is not None for c in chunks)
    deltas = [c.choices[0].delta for c in chunks[1:] if c.choices]
    reasoning = [getattr(d, "reasoning_content", None) for d in deltas]
    assert [r is not None for r in reasoning] == [True, True, False, False]  # 3+1 reasoning | 3+3 content
    assert [c.usage.completion_tokens for c in chunks[1:-1]] == [3, 4, 7, 10]  # type: ignore[union-attr]
    words = [len((d.content or r or "").split()) for d, r in zip(deltas, reasoning, strict=True)]
    assert words == [3, 1, 3, 3]


def test_split_writes_still_parse(start_sim: StartSim) -> None:
    sim = start_sim(split_writes=True, **FAST)
    with _client(sim) as client:
        chunks = _stream_chat(client, "hi", 4)
    assert len(chunks) == 5
    assert len(read_truth(sim.truth, 1)[0]["chunk_ns"]) == 6  # every event stamped after its last piece


@pytest.mark.parametrize(
    "body, status",
    [
        (b"{oops", 400),
        (chat_body(n=3), 400),
        (chat_body(max_tokens=-1), 400),
        (chat_body(model="other-model"), 404),
    ],
)
def test_errors_are_openai_error_objects(start_sim: StartSim, body: object, status: int) -> None:
    sim = start_sim(**FAST)
    got, answer = post(sim.url + "/v1/chat/completions", body)  # type: ignore[arg-type]
    assert got == status
    assert set(answer["error"]) == {"message", "type", "param", "code"} and answer["error"]["code"] == status
    [record] = read_truth(sim.truth, 1)
    assert record["status"] == status and record["id"] is None


def test_unknown_fields_are_ignored(start_sim: StartSim) -> None:
    sim = start_sim(**FAST)
    status, answer = post(
        sim.url + "/v1/chat/completions",
        chat_body(max_tokens=3, top_k=5, repetition_penalty=1.1, whatever={"x": 1}),
    )
    assert status == 200 and answer["usage"]["completion_tokens"] <= 3


def test_injected_http_errors(start_sim: StartSim) -> None:
    for rate, status in (("fail_rate", 500), ("throttle_rate", 429)):
        sim = start_sim(**{rate: 1.0}, **FAST)
        got, answer = post(sim.url + "/v1/chat/completions", chat_body(max_tokens=3))
        assert got == status and answer["error"]["code"] == status
        assert read_truth(sim.truth, 1)[0]["fault"] == f"http_{status}"


def test_injected_reset_breaks_the_stream(start_sim: StartSim) -> None:
    sim = start_sim(reset_rate=1.0, **FAST)

    async def read_stream() -> bytes:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                sim.url + "/v1/chat/completions", json=chat_body(max_tokens=50, stream=True, ignore_eos=True)
            ) as resp:
                return await resp.read()

    with pytest.raises(aiohttp.ClientError):
        asyncio.run(read_stream())
    with pytest.raises(openai.APIConnectionError), _client(sim) as client:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5)
    records = read_truth(sim.truth, 2)
    assert [r["fault"] for r in records] == ["reset", "reset"]
    assert records[0]["completion_tokens"] <= 50 and "d" not in records[0]["kinds"]


def test_first_byte_delay_and_stall_show_in_timing(start_sim: StartSim) -> None:
    sim = start_sim(first_byte_delay=0.3, stall_rate=1.0, stall_seconds=0.4, **FAST)
    start = time.perf_counter()
    with _client(sim) as client:
        chunks = _stream_chat(client, "x", 8)
    assert len(chunks) == 9 and time.perf_counter() - start >= 0.7
    [record] = read_truth(sim.truth, 1)
    assert first_content_ns(record) - record["arrival_ns"] >= 0.3e9
    gaps = [b - a for a, b in zip(record["chunk_ns"], record["chunk_ns"][1:], strict=False)]
    assert max(gaps) >= 0.4e9 and record["fault"] == "stall"


def test_metrics_agree_with_the_truth_log(start_sim: StartSim) -> None:
    sim = start_sim(mean_output_tokens=20, **FAST)
    shared = "shared system prompt " * 30

    async def one(client: openai.AsyncOpenAI, i: int) -> None:
        messages = [{"role": "system", "content": shared}, {"role": "user", "content": f"question {i}"}]
        if i % 2:
            await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40)  # type: ignore[arg-type]
            return
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=40,  # type: ignore[arg-type]
            stream=True,
        )
        async for _ in stream:
            pass

    async def load() -> None:
        async with openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0) as client:
            await asyncio.gather(*(one(client, i) for i in range(16)))

    asyncio.run(load())
    asyncio.run(load())  # the second round hits the prefix cache
    records = read_truth(sim.truth, 32)
    assert all(r["status"] == 200 for r in records)
    text = get(sim.url + "/metrics")[1].decode()
    assert len(records) == 32
    assert metric(text, "vllm:e2e_request_latency_seconds_count") == 32
    assert metric(text, "vllm:time_to_first_token_seconds_count") == 32
    assert metric(text, "vllm:prompt_tokens_total") == sum(r["prompt_tokens"] for r in records)
    assert metric(text, "vllm:generation_tokens_total") == sum(r["completion_tokens"] for r in records)
    assert metric(text, "vllm:prefix_cache_hits_total") == sum(r["cached_tokens"] for r in records) > 0
    assert metric(text, "vllm:prefix_cache_queries_total") == sum(r["prompt_tokens"] for r in records)
    assert metric(text, "vllm:inter_token_latency_seconds_count") == sum(
        r["completion_tokens"] - 1 for r in records
    )
    assert metric(text, "vllm:num_requests_running") == metric(text, "vllm:num_requests_waiting") == 0


def test_reset_prefix_cache_endpoint(start_sim: StartSim) -> None:
    sim = start_sim(**FAST)
    body = chat_body("a long enough prompt to fill two blocks " * 5, max_tokens=2)

    def cached() -> int:
        status, answer = post(sim.url + "/v1/chat/completions", body)
        assert status == 200
        return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert cached() == 0
    assert cached() > 0
    assert post(sim.url + "/reset_prefix_cache", b"")[0] == 200
    assert cached() == 0


def test_next_turn_hits_its_own_reply_and_token_ids_come_back(start_sim: StartSim) -> None:
    """vLLM caches the blocks its generated tokens fill: a conversation's next turn, which carries
    the reply, is served from the cache up to the last full block before the new message."""
    sim = start_sim(block_size=4, **FAST)
    first = chat_body("tell me about rivers and mountains " * 4, max_tokens=16, ignore_eos=True,
                      return_token_ids=True)  # fmt: skip
    status, answer = post(sim.url + "/v1/chat/completions", first)
    assert status == 200
    choice, usage = answer["choices"][0], answer["usage"]
    assert len(choice["token_ids"]) == usage["completion_tokens"] == 16
    reply = {"role": "assistant", "content": choice["message"]["content"]}
    following = dict(first, messages=[*first["messages"], reply, {"role": "user", "content": "and trains?"}])
    status, answer = post(sim.url + "/v1/chat/completions", following)
    assert status == 200
    computed = usage["prompt_tokens"] + 16 - 1  # the last generated token's KV is never computed
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == computed // 4 * 4
    stream = post(sim.url + "/v1/completions", {"prompt": "one two", "max_tokens": 5, "ignore_eos": True,
                                                "stream": True, "return_token_ids": True})  # fmt: skip
    assert stream[0] == 200
    events = [orjson.loads(line[6:]) for line in stream[1].split(b"\n") if line.startswith(b"data: {")]
    assert sum(len(e["choices"][0]["token_ids"]) for e in events if e["choices"]) == 5


def test_an_echoed_rejection_quotes_the_request(start_sim: StartSim) -> None:
    sim = start_sim(echo_reject_rate=1.0, **FAST)
    got, answer = post(sim.url + "/v1/chat/completions", chat_body(max_tokens=3))
    assert got == 400 and answer["error"]["type"] == "BadRequestError"
    assert (
        answer["error"]["message"].startswith('Invalid request: {"')
        and '"messages"' in answer["error"]["message"]
    )
    assert read_truth(sim.truth, 1)[0]["fault"] == "echo_400"
