"""Pinned request bodies: identical sampling for every target, TGI's spelling of a JSON schema."""

from __future__ import annotations

from replayproxy.check.prompts import parse_prompts
from replayproxy.check.requests import Sampling, request_body

SCHEMA = {"type": "object"}
LINES = [
    (
        1,
        {
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 1.5,
            "ignore_eos": True,
            "stop": ["x"],
        },
    ),
    (
        2,
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 7,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
        },
    ),
]


def test_sampling_is_pinned_and_forced_length_removed() -> None:
    chat, schema = parse_prompts("t", LINES)
    body = request_body(chat, Sampling(seed=5, max_tokens=64), "m", "vllm")
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stop": ["x"],
        "max_tokens": 64,
        "temperature": 0.0,
        "seed": 5,
        "stream": False,
    }
    assert request_body(schema, Sampling(), "", "openai")["max_tokens"] == 7
    assert "model" not in request_body(schema, Sampling(), "", "openai")


def test_dialects_spell_response_format() -> None:
    _, schema = parse_prompts("t", LINES)
    openai = request_body(schema, Sampling(), "m", "vllm")["response_format"]
    assert openai == {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
    assert request_body(schema, Sampling(), "m", "tgi")["response_format"] == {
        "type": "json_object",
        "value": SCHEMA,
    }
