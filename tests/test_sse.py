"""The SSE decoder at every split of a byte stream, and classification of real engines' chunks."""

from __future__ import annotations

import itertools

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replayproxy import sse
from replayproxy.sse import (
    CONTENT,
    DONE,
    EMPTY,
    ERROR,
    OTHER,
    ROLE,
    USAGE,
    SSEDecoder,
    SSEEvent,
    StreamClassifier,
    Usage,
    classify,
    parse_usage,
)

VLLM_STREAM = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant",'
    b'"content":""},"logprobs":null,"finish_reason":null}]}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"lo \\u00e9\xc3\xa9"},'
    b'"finish_reason":"stop"}]}\n\n'
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}\n\n'
    b"data: [DONE]\n\n"
)


def decode_all(pieces: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return [event for piece in pieces for event in decoder.feed(piece)]


def same_events(got: list[SSEEvent], want: list[SSEEvent]) -> bool:
    """Equal events; `end` may stop before the LF of a CRLF that a split cut in two (it is not seen yet)."""
    return len(got) == len(want) and all(
        g._replace(end=0) == w._replace(end=0) and w.end - 1 <= g.end <= w.end
        for g, w in zip(got, want, strict=True)
    )


def test_a_whole_stream_decodes_into_its_events() -> None:
    events = decode_all([VLLM_STREAM])
    assert [classify(e.data).kind for e in events] == [ROLE, CONTENT, CONTENT, USAGE, DONE]
    assert events[-1].end == len(VLLM_STREAM)
    assert all(VLLM_STREAM[e.end - 2 : e.end] == b"\n\n" for e in events)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_every_single_split_position_gives_the_same_events(newline: bytes) -> None:
    stream = VLLM_STREAM.replace(b"\n", newline)
    whole = decode_all([stream])
    assert len(whole) == 5
    for i in range(len(stream) + 1):
        assert same_events(decode_all([stream[:i], stream[i:]]), whole), f"split at {i}"


def test_every_pair_of_split_positions_and_byte_by_byte() -> None:
    stream = b"\xef\xbb\xbfid: 7\r\ndata: a\r\n: comment\r\ndata:b\r\n\r\nevent: x\rdata: c\r\r"
    whole = decode_all([stream])
    assert whole == [SSEEvent(b"a\nb", "", "7", None, 40), SSEEvent(b"c", "x", "7", None, len(stream))]
    for i, j in itertools.combinations(range(len(stream) + 1), 2):
        assert same_events(decode_all([stream[:i], stream[i:j], stream[j:]]), whole), (i, j)
    assert same_events(decode_all([stream[k : k + 1] for k in range(len(stream))]), whole)


def test_field_rules_of_the_spec() -> None:
    events = decode_all(
        [b"data\n\nretry: 150\ndata:  two spaces\n\nretry: x\nid: a\0b\nevent: e\n\n\ndata: after\n\n"]
    )
    # "data" without a colon is an empty data line; only one leading space is stripped; an event with
    # no data is not dispatched and its type is reset; an id with NUL is ignored.
    assert [(e.data, e.event, e.id, e.retry_ms) for e in events] == [
        (b"", "", None, None),
        (b" two spaces", "", None, 150),
        (b"after", "", None, 150),
    ]


def test_an_incomplete_event_is_not_dispatched() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a": 1}\n') == []
    assert decoder.feed(b"data: [DONE]") == []
    assert [e.data for e in decoder.feed(b"\n\n")] == [b'{"a": 1}\n[DONE]']
    assert decoder.feed(b"") == []


@given(st.lists(st.binary(max_size=40), max_size=6), st.lists(st.integers(0, 400), max_size=5))
def test_random_bytes_any_split_never_changes_the_events(parts: list[bytes], cuts: list[int]) -> None:
    stream = b"\n\n".join(b"data: " + p for p in parts) + b"\n\n"
    points = sorted({min(c, len(stream)) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    assert decode_all(pieces) == decode_all([stream])


# --------------------------------------------------------------------------- classification


def chunk(**fields: object) -> bytes:
    return orjson.dumps({"id": "x", "object": "chat.completion.chunk", **fields})


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (chunk(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}]), ROLE),
        (chunk(choices=[{"index": 0, "delta": {"role": "assistant"}}]), ROLE),
        (chunk(choices=[{"index": 0, "delta": {"content": "hi"}}]), CONTENT),
        (chunk(choices=[{"index": 0, "delta": {"reasoning_content": "hmm"}}]), CONTENT),
        (chunk(choices=[{"index": 0, "delta": {"reasoning": "hmm", "content": None}}]), CONTENT),
        (
            chunk(
                choices=[
                    {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}
                ]
            ),
            CONTENT,
        ),
        (chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]), EMPTY),
        (chunk(choices=[{"index": 0, "delta": {"content": ""}, "finish_reason": None}]), EMPTY),
        (orjson.dumps({"object": "text_completion", "choices": [{"index": 0, "text": " the"}]}), CONTENT),
        (orjson.dumps({"object": "text_completion", "choices": [{"index": 0, "text": ""}]}), EMPTY),
        (chunk(choices=[], usage={"prompt_tokens": 3, "completion_tokens": 4}), USAGE),
        (chunk(choices=[]), EMPTY),
        (b"[DONE]", DONE),
        (b" [DONE] ", DONE),
        (orjson.dumps({"error": {"message": "boom", "code": 500}}), ERROR),
        (b"not json", OTHER),
        (b"[1, 2]", OTHER),
        (b"", OTHER),
        (orjson.dumps({"choices": ["odd", None]}), EMPTY),
    ],
)
def test_classify_kinds(data: bytes, kind: str) -> None:
    assert classify(data).kind == kind


def test_classify_reports_usage_and_finish_reason() -> None:
    info = classify(
        chunk(
            choices=[{"index": 0, "delta": {"content": "x"}, "finish_reason": "length"}],
            usage={"prompt_tokens": 5, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}},
        )
    )
    assert (info.kind, info.finish_reason, info.usage) == (CONTENT, "length", Usage(5, 9, 4))


def test_parse_usage_ignores_nonsense() -> None:
    assert parse_usage(None) is None
    assert parse_usage({"prompt_tokens": "3", "completion_tokens": True}) == Usage(-1, -1, -1)


@given(st.lists(st.text(max_size=12), min_size=1, max_size=8))
def test_stream_classifier_agrees_with_classify(texts: list[str]) -> None:
    classifier = StreamClassifier()
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m"}
    chunks = [
        orjson.dumps(
            {
                **head,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                ],
            }
        )
    ]
    for text in texts:
        for key in ("content", "reasoning_content"):
            chunks.append(
                orjson.dumps({**head, "choices": [{"index": 0, "delta": {key: text}, "finish_reason": None}]})
            )
    chunks.append(
        orjson.dumps({**head, "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}]})
    )
    chunks.append(
        orjson.dumps({**head, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}})
    )
    for data in chunks:
        assert classifier.classify(data) == classify(data), data


def test_stream_classifier_follows_an_envelope_that_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp stamps each chunk's `created` with the current second: a new envelope is parsed
    once, then recognised, however many there are in a long stream."""
    parsed: list[bytes] = []
    real = sse.classify
    monkeypatch.setattr(sse, "classify", lambda data: parsed.append(data) or real(data))
    classifier = StreamClassifier()
    chunks = [
        orjson.dumps(
            {
                "choices": [{"delta": {"content": f"t{i}"}, "finish_reason": None, "index": 0}],
                "created": 1_700_000_000 + i // 5,
                "id": "chatcmpl-1",
                "model": "m",
                "object": "chat.completion.chunk",
            }
        )
        for i in range(50)
    ]
    assert [classifier.classify(data).kind for data in chunks] == [CONTENT] * 50
    assert len(parsed) == 10


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (
            b'{"error": {"message": "you said: secret", "type": "BadRequestError", "code": 400}}',
            "BadRequestError",
        ),
        (
            b'{"object": "error", "message": "secret", "type": "invalid_request_error"}',
            "invalid_request_error",
        ),
        (b'{"error": "Input validation error: secret", "error_type": "validation"}', "validation"),
        (b'{"error": {"message": "secret", "code": 503}}', "503"),
        (b'{"error": {"message": "m", "type": "secret words here", "code": "also secret"}}', ""),
        (b'{"error": {"type": "' + b"x" * 60 + b'"}}', ""),
        (b'{"error": {"type": true, "code": -1}}', ""),
        (b"secret plain text", ""),
        (b"[1, 2]", ""),
    ],
)
def test_an_error_kind_is_a_short_token_never_the_message(body: bytes, kind: str) -> None:
    assert sse.error_kind(body) == kind
