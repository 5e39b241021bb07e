"""JSON and tool-call answers: schema-following values, truncation by max_tokens, the wire shapes."""

from __future__ import annotations

import random
from collections.abc import Callable

import jsonschema
import orjson
import pytest

from replayproxy.sim.structured import (
    JSON_SCHEMA,
    TOOL_CALL,
    Structure,
    StructureError,
    parse_structure,
    shape,
)
from tests.sim.conftest import RunningSim
from tests.sim.helpers import chat_body, post

StartSim = Callable[..., RunningSim]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "unit": {"enum": ["C", "F"]},
        "ok": {"type": "boolean"},
    },
    "required": ["city", "days"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]


def test_schema_values_validate() -> None:
    for seed in range(30):
        shaped = shape(Structure(JSON_SCHEMA, schema=SCHEMA), random.Random(seed), 500)
        assert shaped.finish_reason == "stop" and shaped.pieces[-1] == ""
        jsonschema.validate(orjson.loads("".join(shaped.pieces)), SCHEMA)


def test_max_tokens_cuts_the_json() -> None:
    shaped = shape(Structure(JSON_SCHEMA, schema=SCHEMA), random.Random(0), 5)
    assert shaped.finish_reason == "length" and len(shaped.pieces) == 5
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads("".join(shaped.pieces))


def test_forced_lengths_pad_with_whitespace() -> None:
    structure = Structure(JSON_SCHEMA, schema=SCHEMA)
    natural = shape(structure, random.Random(0), 500)
    forced = shape(structure, random.Random(0), 300, ignore_eos=True)
    assert len(forced.pieces) == 300 and forced.finish_reason == "length"
    assert orjson.loads("".join(forced.pieces)) == orjson.loads("".join(natural.pieces))
    at_least = shape(structure, random.Random(0), 500, min_tokens=200)
    assert len(at_least.pieces) == 200 and at_least.pieces[-1] == "" and at_least.finish_reason == "stop"
    jsonschema.validate(orjson.loads("".join(at_least.pieces)), SCHEMA)


def test_parse_structure_rules() -> None:
    assert parse_structure({}) is None
    assert parse_structure({"response_format": {"type": "text"}}) is None
    choice = {"type": "function", "function": {"name": "get_time"}}
    forced = parse_structure({"tools": TOOLS, "tool_choice": choice})
    assert forced is not None and forced.kind == TOOL_CALL and [t[0] for t in forced.tools] == ["get_time"]
    assert parse_structure({"tools": TOOLS, "tool_choice": "none"}) is None
    unknown_tool = {"tools": TOOLS, "tool_choice": {"function": {"name": "x"}}}
    for bad in (
        {"response_format": {"type": "xml"}},
        {"response_format": {"type": "json_schema"}},
        {"tools": [{"type": "function"}]},
        unknown_tool,
    ):
        with pytest.raises(StructureError):
            parse_structure(bad)


def test_json_schema_and_tool_call_over_http(start_sim: StartSim) -> None:
    sim = start_sim(speed=50)
    url = sim.url + "/v1/chat/completions"
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
    status, answer = post(url, chat_body("Weather?", temperature=0, max_tokens=200, response_format=fmt))
    assert status == 200
    jsonschema.validate(orjson.loads(answer["choices"][0]["message"]["content"]), SCHEMA)
    status, answer = post(url, chat_body("Weather?", temperature=0, max_tokens=200, tools=TOOLS))
    choice = answer["choices"][0]
    assert status == 200 and choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] in ("get_weather", "get_time") and isinstance(orjson.loads(call["arguments"]), dict)
    status, answer = post(url, chat_body("Weather?", response_format={"type": "yaml"}))
    assert status == 400 and answer["error"]["param"] == "response_format"


def test_streamed_tool_call_reassembles(start_sim: StartSim) -> None:
    import asyncio

    import aiohttp

    sim = start_sim(speed=50)
    body = chat_body("Weather?", temperature=0, max_tokens=200, tools=TOOLS[:1], stream=True)

    async def read() -> list[dict[str, object]]:
        async with aiohttp.ClientSession() as session:
            async with session.post(sim.url + "/v1/chat/completions", json=body) as resp:
                raw = await resp.read()
        lines = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: {")]
        return [orjson.loads(line) for line in lines]

    events = asyncio.run(read())
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]  # type: ignore[index]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    arguments = "".join(c["function"]["arguments"] for c in calls)
    jsonschema.validate(orjson.loads(arguments), SCHEMA)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"  # type: ignore[index]
