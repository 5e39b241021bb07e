"""Flavors: each engine's names for exact output length, usage options, tools, and pre-run actions."""

from __future__ import annotations

import orjson
import pytest

from replayproxy.replay import flavors

CHAT = flavors.Planned(
    "chat",
    "m",
    [{"role": "user", "content": "hi"}],
    True,
    17,
    {"temperature": 0.5, "top_p": 0.9, "top_k": 40, "n": 2, "stop": True, "ignore_eos": False},
    True,
    True,
)


def test_vllm_forces_the_length_and_asks_for_per_chunk_usage() -> None:
    body = flavors.request_body(flavors.get("vllm"), CHAT)
    assert body["max_tokens"] == 17 and body["min_tokens"] == 17 and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["temperature"] == 0.5 and body["top_p"] == 0.9 and body["top_k"] == 40 and body["n"] == 2
    assert "stop" not in body  # only presence was recorded: never invent a stop string
    assert body["tools"] == [flavors.DUMMY_TOOL] and body["tool_choice"] == "none"
    assert body["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize("name", ["tgi", "ollama", "openai"])
def test_engines_without_length_forcing_send_only_max_tokens(name: str) -> None:
    body = flavors.request_body(flavors.get(name), CHAT)
    assert body["max_tokens"] == 17
    assert "ignore_eos" not in body and "min_tokens" not in body
    assert "top_k" not in body
    assert "continuous_usage_stats" not in body.get("stream_options", {})
    assert not flavors.get(name).exact_output


def test_flavor_table_facts() -> None:
    assert flavors.get("vllm").pre_run[0].path == "/reset_prefix_cache"
    assert flavors.get("sglang").pre_run[0].path == "/flush_cache"
    assert {n for n, f in flavors.FLAVORS.items() if f.token_id_prompts} == {
        "vllm",
        "sglang",
        "trtllm",
        "llamacpp",
    }
    assert "n" not in flavors.request_body(flavors.get("tgi"), CHAT)
    assert flavors.request_body(flavors.get("llamacpp"), CHAT)["ignore_eos"] is True


def test_completions_and_non_streaming_bodies() -> None:
    plan = flavors.Planned("completions", "m", [1, 2, 3], False, 5, {}, True, True)
    body = flavors.request_body(flavors.get("vllm"), plan)
    assert body["prompt"] == [1, 2, 3] and body["stream"] is False
    assert "stream_options" not in body and "tools" not in body and "response_format" not in body


def test_key_order_is_fixed() -> None:
    first = orjson.dumps(flavors.request_body(flavors.get("sglang"), CHAT))
    assert first == orjson.dumps(flavors.request_body(flavors.get("sglang"), CHAT))
    assert list(orjson.loads(first))[:3] == ["model", "messages", "max_tokens"]


def test_unknown_flavor_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="vllm, sglang"):
        flavors.get("nope")


def test_guess_from_models_answer() -> None:
    assert flavors.guess({"data": [{"id": "x", "owned_by": "vllm"}]}) == "vllm"
    assert flavors.guess({"data": [{"id": "x", "owned_by": "sglang"}]}) == "sglang"
    assert flavors.guess({"data": [{"id": "x", "owned_by": "replayproxy-sim"}]}) == "vllm"  # vLLM-compatible
    assert flavors.guess({"data": [{"id": "x", "owned_by": "openai"}]}) == "openai"
    assert flavors.guess(None) == "openai"
