"""RequestTimeline: timestamps per network read, TTFT on the first generated output, tokens per chunk."""

from __future__ import annotations

import orjson
import pytest

from replayproxy.replay.prepared import Prepared
from replayproxy.replay.request_timeline import RequestTimeline
from replayproxy.results import ReplayResult


def prepared(stream: bool = True) -> Prepared:
    return Prepared(
        index=7,
        scheduled_ns=1_000,
        endpoint="chat",
        path="/v1/chat/completions",
        body=b"{}",
        stream=stream,
        expected_input_tokens=10,
        expected_output_tokens=3,
    )


def event(delta: dict[str, object] | None = None, usage: int | None = None, choices: bool = True) -> bytes:
    obj: dict[str, object] = {"id": "x", "choices": [{"index": 0, "delta": delta or {}}] if choices else []}
    if usage is not None:
        obj["usage"] = {
            "prompt_tokens": 10,
            "completion_tokens": usage,
            "prompt_tokens_details": {"cached_tokens": 4},
        }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


STREAM = (
    event({"role": "assistant", "content": ""}, usage=0)
    + event({"reasoning_content": "hm"}, usage=1)
    + event({"content": "a b"}, usage=3)
    + event({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}, usage=4)
    + event(choices=False, usage=4)
    + b"data: [DONE]\n\n"
)


def run(reads: list[tuple[int, bytes]], status: int = 200, stream: bool = True) -> ReplayResult:
    done: list[RequestTimeline] = []
    ex = RequestTimeline(prepared(stream), scheduled_at=101_000, on_done=done.append)
    ex.sent(100_000 + 2_000)
    ex.on_headers(reads[0][0], status)
    for at, data in reads:
        ex.on_body(at, data)
    ex.on_complete(reads[-1][0])
    assert done == [ex]
    return ex.result(run_start_ns=100_000)


def test_every_content_kind_counts_and_role_chunk_does_not() -> None:
    times = [200_000, 300_000, 450_000, 700_000, 800_000, 900_000]
    pieces = STREAM.split(b"\n\n")[:-1]
    result = run([(t, p + b"\n\n") for t, p in zip(times, pieces, strict=True)])
    assert result.ttft_ns == 300_000 - 102_000  # the reasoning chunk, not the role chunk
    assert result.content_chunks == 3
    assert result.chunk_gaps_us == (150, 250)
    assert result.chunk_tokens == (1, 2, 1)  # from cumulative continuous usage
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (10, 4, 4)
    assert result.scheduled_ns == 1_000 and result.sent_ns == 2_000
    assert result.headers_ns == 200_000 - 102_000 and result.e2e_ns == 900_000 - 102_000
    assert result.error == "" and result.status == 200


def test_events_completed_by_a_read_get_that_reads_time_at_any_split() -> None:
    first_content_end = STREAM.index(b"\n\n", STREAM.index(b"reasoning_content")) + 2
    for cut in range(1, len(STREAM)):
        result = run([(10_000_000, STREAM[:cut]), (20_000_000, STREAM[cut:])])
        expected = 10_000_000 if cut >= first_content_end else 20_000_000
        assert result.ttft_ns == expected - 102_000, cut
        assert result.content_chunks == 3 and result.chunk_tokens == (1, 2, 1)


def test_chunks_without_usage_keep_no_token_counts() -> None:
    body = event({"content": "a"}) + event({"content": "b"}, usage=2) + b"data: [DONE]\n\n"
    result = run([(500_000, body)])
    assert result.content_chunks == 2 and result.chunk_tokens == ()


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (500, {"error": {"message": "secret internal error", "code": 500}}, "HTTP 500 500"),
        (
            400,
            {"error": {"message": "bad: 'secret'", "type": "BadRequestError", "code": 400}},
            "HTTP 400 BadRequestError",
        ),
        (
            400,
            {"object": "error", "message": "secret", "type": "invalid_request_error"},
            "HTTP 400 invalid_request_error",
        ),
        (422, {"error": "Input validation error: secret", "error_type": "validation"}, "HTTP 422 validation"),
        (400, {"error": {"message": "x", "type": "you sent 'secret'", "code": "secret value"}}, "HTTP 400"),
        (429, "slow down, secret", "HTTP 429"),
    ],
)
def test_http_errors_keep_the_status_and_the_engines_error_type_never_its_text(
    status: int, body: object, message: str
) -> None:
    raw = orjson.dumps(body) if not isinstance(body, str) else body.encode()
    result = run([(300_000, raw)], status=status)
    assert result.error == ("http_4xx" if status < 500 else "http_5xx")
    assert result.error_message == message and "secret" not in result.error_message


def test_stream_without_content_is_a_bad_stream() -> None:
    result = run([(300_000, event({"role": "assistant"}) + b"data: [DONE]\n\n")])
    assert result.error == "bad_stream" and result.ttft_ns == -1


def test_error_event_inside_a_stream() -> None:
    body = (
        event({"content": "a"})
        + b'data: {"error": {"message": "engine died", "type": "EngineDeadError"}}\n\n'
    )
    result = run([(300_000, body)])
    assert result.error == "other" and result.error_message == "error event EngineDeadError"


def test_non_streaming_answer() -> None:
    answer = orjson.dumps(
        {"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 10, "completion_tokens": 3}}
    )
    result = run([(300_000, answer[:20]), (400_000, answer[20:])], stream=False)
    assert result.error == "" and result.e2e_ns == 400_000 - 102_000
    assert result.ttft_ns == 300_000 - 102_000  # its first byte, where the proxy takes it too
    assert result.completion_tokens == 3 and result.content_chunks == 1


def test_failure_is_final_and_reported_once() -> None:
    done: list[RequestTimeline] = []
    ex = RequestTimeline(prepared(), 0, done.append)
    ex.sent(10)
    ex.fail(50, "reset", "connection lost")
    ex.fail(60, "timeout", "late")
    ex.on_complete(70)
    assert len(done) == 1
    result = ex.result(0)
    assert (result.error, result.error_message, result.e2e_ns) == ("reset", "connection lost", 40)
