"""Usage injection: the upstream is asked for usage, the client's bytes stay exactly as without the proxy."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest

from replayproxy.proxy.usage import UsageStripper, inject
from tests.proxy.helpers import CaptureSink, RawRequest, RawUpstream, proxy, run
from tests.trace.helpers import shapes_of

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3,"total_tokens":7}}\n\n'
DONE = b"data: [DONE]\n\n"


def test_inject_splices_the_option_and_keeps_every_other_byte() -> None:
    body = b'  {"model": "m", "stream": true,\n "messages": [{"role":"user","content":"\\u00e9 stream"}]}'
    new, parsed = inject(body)
    assert new == b'  {"stream_options":{"include_usage":true},"model": "m", "stream": true,\n' + body[33:]
    assert orjson.loads(new)["stream_options"] == {"include_usage": True}
    assert parsed["model"] == "m"


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","messages":[]}',
        b'{"stream":false}',
        b'{"stream":true,"stream_options":{"include_usage":false}}',
        b'{"stream":true,"stream_options":{"continuous_usage_stats":true}}',
        b'{"stream":"true"}',
        b'[{"stream":true}]',
        b'{"stream":tru',
    ],
)
def test_inject_leaves_other_bodies_alone(body: bytes) -> None:
    assert inject(body)[0] is None


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_stripper_removes_only_the_usage_event_at_any_split(newline: bytes) -> None:
    stream = (ROLE + TOKEN + TOKEN + USAGE + DONE).replace(b"\n", newline)
    expected = (ROLE + TOKEN + TOKEN + DONE).replace(b"\n", newline)
    for i in range(len(stream) + 1):
        for j in range(i, len(stream) + 1, 7):
            stripper = UsageStripper()
            out = (
                stripper.feed(stream[:i])
                + stripper.feed(stream[i:j])
                + stripper.feed(stream[j:])
                + stripper.flush()
            )
            assert out == expected, (i, j)


def test_openai_null_usage_in_every_chunk_is_kept_and_the_real_one_dropped() -> None:
    """OpenAI's API sends "usage":null in each chunk once include_usage is set, then the usage event."""
    token = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}\n\n'
    spaced = b'data: {"choices": [{"index": 0, "delta": {"content": "y"}}], "usage": null}\n\n'
    stripper = UsageStripper()
    pieces = (token, spaced, token + spaced, token + USAGE, USAGE + token, DONE)
    assert [stripper.feed(piece) for piece in pieces] == [token, spaced, token + spaced, token, token, DONE]


def test_stripper_keeps_usage_that_rides_on_content_and_an_unterminated_tail() -> None:
    riding = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"completion_tokens":1}}\n\n'
    stripper = UsageStripper()
    assert stripper.feed(riding + b"data: tail") == riding
    assert stripper.flush() == b"data: tail"


def vllm_like(request: RawRequest) -> None:
    """Streams like vLLM: one chunk per event, a usage event only when stream_options.include_usage is set."""
    body = orjson.loads(request.body)
    events = [ROLE, TOKEN, TOKEN, TOKEN]
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append(USAGE)
    events.append(DONE)
    if request.target.endswith(b"?length"):  # rare: an SSE body with Content-Length framing
        data = b"".join(events)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(data)
        request.connection.write(head + data)
        return
    request.connection.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    for event in events:
        request.connection.write(b"%x\r\n%b\r\n" % (len(event), event))
    request.connection.write(b"0\r\n\r\n")


def test_client_bytes_unchanged_while_usage_is_recorded(tmp_path: Path) -> None:
    plain = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    asking = {**plain, "stream_options": {"include_usage": True}}

    async def main() -> None:
        async with RawUpstream(vllm_like) as up:
            async with aiohttp.ClientSession() as session:
                cases = [
                    (path, name, body)
                    for path in ("", "?length")
                    for name, body in (("plain", plain), ("asking", asking))
                ]
                direct = {}
                for path, name, body in cases:
                    async with session.post(up.url + "/v1/chat/completions" + path, json=body) as resp:
                        direct[path, name] = await resp.read()
                async with proxy(up.url, tmp_path) as px:
                    for path, name, body in cases:
                        async with session.post(px.url + "/v1/chat/completions" + path, json=body) as resp:
                            assert await resp.read() == direct[path, name]
            sent = [orjson.loads(r.body) for r in up.requests[4:]]
            assert (
                sent[0]["stream_options"] == {"include_usage": True} == sent[2]["stream_options"]
            )  # injected
            assert sent[1] == asking == sent[3]  # untouched

    run(main())
    shapes = shapes_of(tmp_path)
    assert [(s.input_tokens, s.output_tokens, s.output_estimated) for s in shapes] == [(4, 3, False)] * 4


def test_without_usage_the_output_is_counted_and_marked_estimated(tmp_path: Path) -> None:
    async def main() -> None:
        async with RawUpstream(vllm_like) as up, proxy(up.url, tmp_path, inject_usage=False) as px:
            async with aiohttp.ClientSession() as session:
                body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
                async with session.post(px.url + "/v1/chat/completions", json=body) as resp:
                    await resp.read()
            assert b"stream_options" not in up.requests[0].body

    run(main())
    [shape] = shapes_of(tmp_path)
    assert (shape.input_tokens, shape.output_tokens, shape.output_estimated) == (-1, 3, True)


def test_unobserved_requests_are_not_rewritten() -> None:
    async def main() -> None:
        sink = CaptureSink(endpoints=())
        async with RawUpstream(vllm_like) as up, proxy(up.url, observer=sink) as px:
            async with aiohttp.ClientSession() as session:
                body = {"stream": True, "messages": []}
                async with session.post(px.url + "/v1/chat/completions", json=body) as resp:
                    await resp.read()
            assert orjson.loads(up.requests[0].body) == body and sink.captures == []

    run(main())


FP_TOKEN = b'data: {"id":"c","system_fingerprint":"fp","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
FP_USAGE = b'data: {"id":"c","system_fingerprint":"fp","choices":[],"usage":{"prompt_tokens":4}}\n\n'
# llama.cpp (build 11434), as it streams a chat: the finish chunk carries `timings` unless usage is
# asked for; then they move to the usage event, after its `usage`.
LLAMA_HEAD = b'{"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":1,"id":"c","model":"m",'
LLAMA_TAIL = b'"system_fingerprint":"b1","object":"chat.completion.chunk"'
TIMINGS = b'"timings":{"cache_n":10,"prompt_n":1,"prompt_ms":3.272,"prompt_per_second":305.6234718826406}'
LLAMA_FINISH = b"data: " + LLAMA_HEAD + LLAMA_TAIL + b"}\n\n"
LLAMA_USAGE = (
    b'data: {"choices":[],"created":1,"id":"c","model":"m","system_fingerprint":"b1",'
    b'"object":"chat.completion.chunk","usage":{"completion_tokens":3,"prompt_tokens":11},'
    + TIMINGS
    + b"}\n\n"
)
LLAMA_DIRECT_FINISH = b"data: " + LLAMA_HEAD + LLAMA_TAIL + b"," + TIMINGS + b"}\n\n"


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        # OpenAI: every chunk carries system_fingerprint, so the usage event adds nothing: dropped.
        (FP_TOKEN + FP_USAGE + DONE, FP_TOKEN + DONE),
        # No finish event to put a field back into: the usage event goes whole, never half-stripped.
        (TOKEN + FP_USAGE + DONE, TOKEN + DONE),
        # A chunk's identity (id here) missing from the finish event is no reason to keep anything.
        (ROLE + TOKEN + USAGE.replace(b"{", b'{"id":"c",', 1) + DONE, ROLE + TOKEN + DONE),
        # llama.cpp: the timings go back to the end of the finish event, where it writes them unasked.
        (ROLE + TOKEN + LLAMA_FINISH + LLAMA_USAGE + DONE, ROLE + TOKEN + LLAMA_DIRECT_FINISH + DONE),
        # A finish event followed by anything else passes on as it came.
        (ROLE + LLAMA_FINISH + TOKEN + DONE, ROLE + LLAMA_FINISH + TOKEN + DONE),
        (ROLE + LLAMA_FINISH, ROLE + LLAMA_FINISH),
    ],
)
def test_the_usage_event_goes_whole_and_fields_it_took_go_back_to_the_finish_event(
    stream: bytes, expected: bytes, newline: bytes
) -> None:
    stream, expected = stream.replace(b"\n", newline), expected.replace(b"\n", newline)
    for i in range(len(stream) + 1):
        for j in range(i, len(stream) + 1, 11):
            stripper = UsageStripper()
            out = stripper.feed(stream[:i]) + stripper.feed(stream[i:j]) + stripper.feed(stream[j:])
            assert out + stripper.flush() == expected, (i, j)


def test_a_finish_event_is_held_only_until_the_next_event_arrives() -> None:
    stripper = UsageStripper()
    assert stripper.feed(ROLE) == ROLE and stripper.idle
    assert stripper.feed(LLAMA_FINISH) == b"" and not stripper.idle
    assert stripper.feed(LLAMA_USAGE + DONE) == LLAMA_DIRECT_FINISH + DONE
    spaced = b'data: {"choices": [{"index": 0, "finish_reason": "stop", "delta": {}}]}\n\n'
    assert stripper.feed(spaced) == b"" and stripper.feed(DONE) == spaced + DONE
