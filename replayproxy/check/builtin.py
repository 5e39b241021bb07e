"""A small generic prompt set for a smoke check, when the user has no evaluation set of their own.

It touches each finding once: plain answers, a system message, a `stop` string, JSON output with
and without a schema, a tool call, a completion prompt and reference answers. Too small to judge
quality; enough to see a template, stop-handling or structured-output difference.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from replayproxy.check.prompts import PromptSet, parse_prompts

_WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "celsius": {"type": "number"}},
    "required": ["city", "celsius"],
}
BUILTIN: tuple[dict[str, Any], ...] = (
    {
        "id": "capital",
        "messages": [{"role": "user", "content": "What is the capital of France? One word."}],
        "reference": "Paris",
    },
    {
        "id": "arithmetic",
        "messages": [{"role": "user", "content": "What is 17 + 25? Answer with the number."}],
        "reference": "42",
    },
    {
        "id": "system-brief",
        "messages": [
            {"role": "system", "content": "You answer in one short sentence."},
            {"role": "user", "content": "Why is the sky blue?"},
        ],
    },
    {
        "id": "count-stop",
        "messages": [{"role": "user", "content": "Count from 1 to 10, one number per line."}],
        "stop": ["5"],
    },
    {"id": "story", "messages": [{"role": "user", "content": "Write a four-line poem about the sea."}]},
    {
        "id": "json-object",
        "messages": [{"role": "user", "content": "Give the colours of the French flag as a JSON object."}],
        "response_format": {"type": "json_object"},
    },
    {
        "id": "json-schema",
        "messages": [{"role": "user", "content": "Today's weather in Oslo, as JSON."}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": _WEATHER_SCHEMA},
        },
    },
    {
        "id": "tool-call",
        "messages": [{"role": "user", "content": "What is the weather in Lima right now?"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather of a city.",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            }
        ],
    },
    {"id": "completion", "prompt": "The three primary colours are"},
)


def builtin_prompts() -> PromptSet:
    canonical = orjson.dumps(list(BUILTIN), option=orjson.OPT_SORT_KEYS)
    prompts = parse_prompts("builtin", enumerate(BUILTIN, 1))
    return PromptSet("builtin", hashlib.sha256(canonical).hexdigest(), prompts)
