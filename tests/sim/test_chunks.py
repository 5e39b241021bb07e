import orjson
from hypothesis import given
from hypothesis import strategies as st

from replayproxy.sim.api import CHAT, COMPLETION
from replayproxy.sim.chunks import DONE, Formatter, chunk_count, chunk_ranges
from replayproxy.sim.sampler import OutputPlan


@given(st.integers(1, 300), st.integers(1, 9), st.integers(0, 320))
def test_ranges_cover_the_output_in_bounded_unmixed_chunks(
    length: int, per_chunk: int, reasoning: int
) -> None:
    ranges = list(chunk_ranges(0, length, True, per_chunk, reasoning))
    assert [r[0] for r in ranges[1:]] == [r[1] for r in ranges[:-1]]
    assert ranges[0][0] == 0 and ranges[-1][1] == length
    assert all(0 < end - start <= per_chunk for start, end in ranges)
    assert not any(start < reasoning < end for start, end in ranges)
    assert chunk_count(length, per_chunk, reasoning) == len(ranges)


def test_only_whole_chunks_are_sent_before_the_end() -> None:
    assert list(chunk_ranges(0, 7, False, 3, 0)) == [(0, 3), (3, 6)]
    assert list(chunk_ranges(6, 7, True, 3, 0)) == [(6, 7)]


def _event(data: bytes) -> dict[str, object]:
    assert data.startswith(b"data: ") and data.endswith(b"\n\n")
    parsed: dict[str, object] = orjson.loads(data[6:])
    return parsed


PLAN = OutputPlan((" a", " b", ""), "stop", None)


def test_chat_chunks_have_vllm_shape() -> None:
    fmt = Formatter(
        CHAT,
        "chatcmpl-1",
        5,
        "m",
        prompt_tokens=10,
        cached_tokens=4,
        reasoning_tokens=1,
        continuous_usage=False,
    )
    role = _event(fmt.role())
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert "usage" not in role
    assert _event(fmt.content(PLAN, 0, 1))["choices"][0]["delta"] == {"reasoning_content": " a"}  # type: ignore[index]
    last = _event(fmt.content(PLAN, 1, 3))["choices"][0]  # type: ignore[index]
    assert last == {
        "index": 0,
        "delta": {"content": " b"},
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": None,
    }
    usage = _event(fmt.usage_event(3))
    assert usage["choices"] == [] and usage["object"] == "chat.completion.chunk"
    assert usage["usage"] == {
        "prompt_tokens": 10,
        "total_tokens": 13,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert DONE == b"data: [DONE]\n\n"


def test_continuous_usage_rides_on_every_chunk() -> None:
    fmt = Formatter(COMPLETION, "cmpl-1", 5, "m", 10, 0, reasoning_tokens=5, continuous_usage=True)
    event = _event(fmt.content(PLAN, 0, 2))
    assert event["object"] == "text_completion"
    # no reasoning outside chat
    assert event["choices"][0]["text"] == " a b"  # type: ignore[index]
    assert event["usage"]["completion_tokens"] == 2  # type: ignore[index]


def test_whole_bodies_split_reasoning_from_content() -> None:
    fmt = Formatter(CHAT, "chatcmpl-1", 5, "m", 10, 0, reasoning_tokens=1, continuous_usage=False)
    body = orjson.loads(fmt.body(PLAN))
    assert body["choices"][0]["message"]["reasoning_content"] == " a"
    assert body["choices"][0]["message"]["content"] == " b"
    assert body["usage"]["completion_tokens"] == 3


def _dialect(dialect: str, include_usage: bool, endpoint: str = CHAT) -> Formatter:
    return Formatter(endpoint, "c-1", 5, "m", 10, 4, 0, False, dialect=dialect, include_usage=include_usage)


def test_llamacpp_moves_timings_from_the_finish_chunk_to_the_usage_event_when_usage_is_asked() -> None:
    timings = {"cache_n": 4, "prompt_n": 6, "prompt_ms": 1.5, "predicted_n": 3, "predicted_ms": 2.25}
    unasked, asked = _dialect("llamacpp", False), _dialect("llamacpp", True)
    assert _event(unasked.role())["choices"][0]["delta"] == {"role": "assistant", "content": None}  # type: ignore[index]
    finish = unasked.content(PLAN, 1, 3)
    assert finish.endswith(b',"timings":' + orjson.dumps(timings) + b"}\n\n") and b"logprobs" not in finish
    assert b"timings" not in asked.content(PLAN, 1, 3)
    usage = _event(asked.usage_event(3))
    assert usage["choices"] == [] and usage["timings"] == timings and usage["usage"]["prompt_tokens"] == 10  # type: ignore[index]
    # a completion carries usage and timings in its finish chunk, asked or not, and no usage event
    for fmt in (_dialect("llamacpp", False, COMPLETION), _dialect("llamacpp", True, COMPLETION)):
        last = _event(fmt.content(PLAN, 1, 3))
        assert last["usage"]["completion_tokens"] == 3 and last["timings"] == timings  # type: ignore[index]
        assert fmt.usage_event(3) == b""
    assert orjson.loads(unasked.body(PLAN))["timings"] == timings


def test_null_usage_and_fingerprints_by_dialect() -> None:
    for dialect, asked, null_usage, fingerprint in [
        ("vllm", True, False, None),
        ("sglang", False, True, None),
        ("tgi", False, True, "3.0.1-native"),
        ("openai", False, False, "fp_sim"),
        ("openai", True, True, "fp_sim"),
        ("trtllm", True, False, None),
    ]:
        chunk = _event(_dialect(dialect, asked).content(PLAN, 0, 1))
        assert ("usage" in chunk and chunk["usage"] is None) is null_usage, dialect
        assert chunk.get("system_fingerprint") == fingerprint, dialect
        assert ("logprobs" in chunk["choices"][0]) is (dialect != "trtllm"), dialect  # type: ignore[index]
