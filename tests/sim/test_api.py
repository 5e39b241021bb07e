from typing import Any

import orjson
import pytest

from replayproxy.sim import tokenizer
from replayproxy.sim.api import CHAT, COMPLETION, ApiError, GenRequest, parse

MODEL = "m"


def _parse(endpoint: str, body: Any, max_model_len: int = 1000) -> GenRequest:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return parse(endpoint, raw, MODEL, max_model_len)


def _error(endpoint: str, body: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        _parse(endpoint, body)
    return info.value


CHAT_OK = {"messages": [{"role": "user", "content": "hi there"}]}


def test_chat_defaults_and_unknown_fields_ignored() -> None:
    req = _parse(CHAT, {**CHAT_OK, "model": MODEL, "top_k": 3, "frobnicate": True})
    assert req.prompt_ids == tokenizer.render_chat([("user", "hi there")])
    assert req.sampling.max_tokens == 1000 - len(req.prompt_ids)  # vLLM: the rest of the context
    assert not req.stream and not req.include_usage


def test_max_completion_tokens_wins_and_stream_options_are_read() -> None:
    req = _parse(
        CHAT,
        {
            **CHAT_OK,
            "max_tokens": 9,
            "max_completion_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    assert req.sampling.max_tokens == 4 and req.include_usage and req.continuous_usage
    alone = _parse(CHAT, {**CHAT_OK, "stream": True, "stream_options": {"continuous_usage_stats": True}})
    assert not alone.include_usage and not alone.continuous_usage


def test_text_parts_are_joined() -> None:
    req = _parse(CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a b"}]}]})
    assert req.prompt_ids == tokenizer.render_chat([("user", "a b")])


@pytest.mark.parametrize(
    "prompt, expected",
    [
        ("the end", [tokenizer.BOS_ID, *tokenizer.encode("the end")]),
        ([5, 6, 7], [5, 6, 7]),
        (["the end"], [tokenizer.BOS_ID, *tokenizer.encode("the end")]),
        ([[8, 9]], [8, 9]),
    ],
)
def test_completion_prompt_forms(prompt: Any, expected: list[int]) -> None:
    assert _parse(COMPLETION, {"prompt": prompt, "max_tokens": 3}).prompt_ids == expected


@pytest.mark.parametrize(
    "endpoint, body, param",
    [
        (CHAT, b"{not json", None),
        (CHAT, [1, 2], None),
        (CHAT, {"messages": []}, "messages"),
        (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages"),
        (CHAT, {**CHAT_OK, "max_tokens": 0}, "max_tokens"),
        (CHAT, {**CHAT_OK, "max_tokens": "5"}, "max_tokens"),
        (CHAT, {**CHAT_OK, "max_tokens": True}, "max_tokens"),
        (CHAT, {**CHAT_OK, "max_tokens": 5, "min_tokens": 6}, "min_tokens"),
        (CHAT, {**CHAT_OK, "n": 2}, "n"),
        (CHAT, {**CHAT_OK, "temperature": -1}, "temperature"),
        (CHAT, {**CHAT_OK, "stop": [""]}, "stop"),
        (CHAT, {**CHAT_OK, "stream": "yes"}, "stream"),
        (CHAT, {**CHAT_OK, "stream_options": {"include_usage": True}}, "stream_options"),
        (CHAT, {**CHAT_OK, "max_tokens": 995}, "max_tokens"),
        (COMPLETION, {"prompt": ""}, "prompt"),
        (COMPLETION, {"prompt": ["a", "b"]}, "prompt"),
        (COMPLETION, {"prompt": [1, -2]}, "prompt"),
        (COMPLETION, {"prompt": [1, 10**9]}, "prompt"),
    ],
)
def test_invalid_requests_answer_400_with_the_parameter(endpoint: str, body: Any, param: str | None) -> None:
    error = _error(endpoint, body)
    assert error.status == 400
    assert error.param == param
    assert orjson.loads(error.body()) == {
        "error": {"message": error.message, "type": "BadRequestError", "param": param, "code": 400}
    }


def test_prompt_longer_than_the_context_is_rejected() -> None:
    error = _error(COMPLETION, {"prompt": list(range(1000))})
    assert error.status == 400 and "maximum context length is 1000" in error.message


def test_another_model_is_404() -> None:
    error = _error(CHAT, {**CHAT_OK, "model": "gpt-9"})
    assert error.status == 404 and error.kind == "NotFoundError"
