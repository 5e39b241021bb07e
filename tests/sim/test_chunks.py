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
