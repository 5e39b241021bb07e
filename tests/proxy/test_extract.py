"""Shapes built from captures: token counts, timings, roles, prefix hashes, sessions and error classes."""

from __future__ import annotations

from typing import Any

import orjson

from replayproxy.proxy.extract import build_shape
from replayproxy.proxy.observe import Capture
from replayproxy.proxy.prompt import PromptHasher
from tests.proxy.helpers import add_piece

KEY = b"k" * 32
MS = 1_000_000


def capture(
    endpoint: str, body: dict[str, Any] | None, pieces: list[tuple[int, bytes]], **fields: Any
) -> Capture:
    data = orjson.dumps(body) if body is not None else b""
    cap = Capture(
        arrival_ns=1000 * MS,
        endpoint=endpoint,
        method="POST",
        path="/v1/x",
        request_body=[data],
        request_bytes=len(data),
        status=200,
        **fields,
    )
    for at_ms, piece in pieces:
        add_piece(cap, piece, (1000 + at_ms) * MS)
    cap.end_ns = (1000 + (pieces[-1][0] if pieces else 0) + 1) * MS
    return cap


def event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def delta(**d: object) -> bytes:
    return event({"choices": [{"index": 0, "delta": d}]})


CHAT = {
    "model": "m1",
    "stream": True,
    "max_tokens": 50,
    "temperature": 0.5,
    "stop": ["secret stop"],
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "messages": [
        {"role": "system", "content": "You are helpful. " * 10},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:x"}},
            ],
        },
    ],
}


def test_streamed_chat_shape() -> None:
    pieces = [
        (10, delta(role="assistant", content="")),
        (30, delta(content="a") + delta(content="b")),  # two events in one read share its time
        (45, delta(reasoning_content="c")),
        (
            50,
            event(
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 70,
                        "completion_tokens": 3,
                        "prompt_tokens_details": {"cached_tokens": 64},
                    },
                }
            ),
        ),
        (51, b"data: [DONE]\n\n"),
    ]
    cap = capture("chat", CHAT, pieces, event_stream=True, injected_usage=True)
    shape = build_shape(cap, PromptHasher(KEY), origin_ns=400 * MS)
    assert (shape.offset_ns, shape.endpoint, shape.model, shape.stream) == (600 * MS, "chat", "m1", True)
    assert (shape.input_tokens, shape.output_tokens, shape.cached_tokens, shape.output_estimated) == (
        70,
        3,
        64,
        False,
    )
    assert (shape.ttft_ns, shape.e2e_ns, shape.chunk_gaps_us) == (30 * MS, 52 * MS, (0, 15_000))
    assert (shape.roles, shape.has_tools, shape.max_tokens) == ("suau", True, 50)
    assert shape.sampling == {"temperature": 0.5, "stop": True, "tools": True}
    assert shape.prefix_units > 200 and len(shape.prefix_hashes) == shape.prefix_units // 64
    assert (shape.session, shape.chat_id) == (0, 0) and (shape.status, shape.error) == (200, "")  # no linker


def test_later_turns_share_their_prefixes() -> None:
    hasher = PromptHasher(KEY)
    first = {**CHAT, "messages": CHAT["messages"][:2]}
    later = build_shape(capture("chat", CHAT, []), hasher, 0)
    opening = build_shape(capture("chat", first, []), hasher, 0)
    other_user = {**CHAT, "messages": [CHAT["messages"][0], {"role": "user", "content": "different"}]}
    stranger = build_shape(capture("chat", other_user, []), hasher, 0)
    shared = len(opening.prefix_hashes)
    assert shared >= 2 and later.prefix_hashes[:shared] == opening.prefix_hashes
    assert stranger.prefix_hashes[:2] == opening.prefix_hashes[:2]  # same tools + system prompt
    rekeyed = build_shape(capture("chat", first, []), PromptHasher(b"z" * 32), 0)
    assert rekeyed.prefix_hashes != opening.prefix_hashes


def test_stream_without_usage_is_estimated_and_error_events_mark_bad_stream() -> None:
    pieces = [(5, delta(content="a")), (6, delta(content="b")), (7, event({"error": {"message": "oops"}}))]
    shape = build_shape(capture("chat", CHAT, pieces, event_stream=True), PromptHasher(KEY), 0)
    assert (shape.input_tokens, shape.output_tokens, shape.output_estimated) == (-1, 2, True)
    assert shape.error == "bad_stream"


# llama.cpp's finish chunk without usage asked for: `timings` carry the exact counts.
LLAMA_TIMINGS = {"cache_n": 10, "prompt_n": 1, "prompt_ms": 3.2, "predicted_n": 2, "predicted_ms": 0.7}


def test_a_stream_without_usage_takes_exact_counts_from_llamacpp_timings() -> None:
    finish = event(
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "timings": LLAMA_TIMINGS}
    )
    pieces = [(5, delta(content="a")), (6, delta(content="b")), (7, finish), (8, b"data: [DONE]\n\n")]
    shape = build_shape(capture("chat", CHAT, pieces, event_stream=True), PromptHasher(KEY), 0)
    assert (shape.input_tokens, shape.output_tokens, shape.cached_tokens) == (11, 2, 10)
    assert (shape.usage_source, shape.output_estimated) == ("timings", False)
    usage = event(
        {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 2}, "timings": LLAMA_TIMINGS}
    )
    pieces[2:3] = [(7, delta()), (7, usage)]  # usage asked for: it wins
    shape = build_shape(capture("chat", CHAT, pieces, event_stream=True), PromptHasher(KEY), 0)
    assert (shape.input_tokens, shape.output_tokens, shape.usage_source) == (11, 2, "usage")
    pieces[2:4] = []
    shape = build_shape(capture("chat", CHAT, pieces, event_stream=True), PromptHasher(KEY), 0)
    assert (shape.output_tokens, shape.usage_source, shape.output_estimated) == (2, "", True)


def test_non_stream_completion_and_embeddings() -> None:
    body = {"model": "m", "prompt": "Once upon a time " * 8, "max_tokens": 7, "seed": 3}
    answer = orjson.dumps(
        {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 33, "completion_tokens": 7}}
    )
    shape = build_shape(capture("completions", body, [(40, answer)]), PromptHasher(KEY), 0)
    assert (shape.stream, shape.input_tokens, shape.output_tokens, shape.ttft_ns) == (False, 33, 7, 40 * MS)
    assert (shape.roles, shape.session, shape.prefix_units, len(shape.prefix_hashes)) == ("", 0, 136, 2)
    ids = build_shape(capture("completions", {"prompt": list(range(40))}, []), PromptHasher(KEY), 0)
    assert ids.prefix_units == len(" ".join(map(str, range(40))))
    embedding = orjson.dumps(
        {"data": [{"embedding": [0.1]}], "usage": {"prompt_tokens": 5, "total_tokens": 5}}
    )
    emb = build_shape(
        capture("embeddings", {"input": "hi", "model": "e"}, [(3, embedding)]), PromptHasher(KEY), 0
    )
    assert (emb.input_tokens, emb.output_tokens, emb.prefix_hashes) == (5, 0, ())


def test_errors_cancels_and_other_requests() -> None:
    hasher = PromptHasher(KEY)
    failed = capture("chat", CHAT, [(2, b'{"error": "bad"}')])
    failed.status = 400
    assert build_shape(failed, hasher, 0).error == "http_4xx"
    cut = capture("chat", CHAT, [(2, delta(content="a"))], event_stream=True, error="client_cancel")
    shape = build_shape(cut, hasher, 0)
    assert (shape.error, shape.output_tokens, shape.e2e_ns) == ("client_cancel", 1, 3 * MS)
    other = capture("other", None, [(1, b"whatever")])
    other.method = "GET"
    shape = build_shape(other, hasher, 0)
    assert (shape.endpoint, shape.method, shape.model, shape.input_tokens, shape.response_bytes) == (
        "other",
        "GET",
        "",
        -1,
        8,
    )
    garbage = Capture(arrival_ns=0, endpoint="chat", method="POST", path="/", request_body=[b"{not json"])
    assert build_shape(garbage, hasher, 0).roles == ""
