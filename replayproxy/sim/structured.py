"""Answers shaped by the request: JSON for `response_format`, a tool call for `tools`.

Engines with guided decoding (vLLM, SGLang, llama.cpp, TGI) emit text that parses as JSON and
follows a given schema, or a tool call naming a declared tool. The sim builds such a value from
the schema with the request's own random stream, so the same prompt at temperature 0 always gets
the same JSON, and an output cut by `max_tokens` is truncated JSON, as from a real engine.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

import orjson

from replayproxy.sim.tokenizer import WORDS

JSON_OBJECT = "json_object"
JSON_SCHEMA = "json_schema"
TOOL_CALL = "tool_call"
_PIECES = re.compile(r"\w+|\s+|[^\w\s]")
_MAX_DEPTH = 4


class StructureError(ValueError):
    """A malformed `response_format` or `tools` field; `param` names it for the 400 answer."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Structure:
    """What shape the answer must have: JSON (maybe with a schema) or a call of one of `tools`."""

    kind: str  # JSON_OBJECT, JSON_SCHEMA or TOOL_CALL
    schema: Any = None  # the JSON schema the value follows (for a tool: each tool's parameters)
    tools: tuple[tuple[str, Any], ...] = ()  # (name, parameters schema) of the callable tools


def parse_structure(body: dict[str, Any]) -> Structure | None:
    """The shape a chat request asks for; tools win over `response_format`, as a tool call ends a turn."""
    tools = _tools(body)
    if tools:
        return Structure(TOOL_CALL, tools=tools)
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", JSON_OBJECT, JSON_SCHEMA):
        raise StructureError(
            "response_format.type must be one of text, json_object, json_schema", "response_format"
        )
    if fmt["type"] == "text":
        return None
    if fmt["type"] == JSON_OBJECT:
        return Structure(JSON_OBJECT)
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise StructureError("response_format.json_schema.schema must be an object", "response_format")
    return Structure(JSON_SCHEMA, schema=spec["schema"])


def _tools(body: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or choice == "none":
        return ()
    if not isinstance(tools, list) or not tools:
        raise StructureError("tools must be a non-empty list", "tools")
    declared = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise StructureError('each tool must be {"type": "function", "function": {"name": ...}}', "tools")
        declared.append((function["name"], function.get("parameters") or {"type": "object"}))
    if isinstance(choice, dict):
        forced = (choice.get("function") or {}).get("name")
        declared = [tool for tool in declared if tool[0] == forced]
        if not declared:
            raise StructureError(f"tool_choice names {forced!r}, which is not in tools", "tool_choice")
    return tuple(declared)


@dataclass(frozen=True, slots=True)
class ShapedText:
    """The answer's pieces (one per token), the tool it calls ('' for JSON) and its finish reason."""

    pieces: tuple[str, ...]
    tool_name: str
    finish_reason: str


def shape(
    structure: Structure, rng: random.Random, max_tokens: int, min_tokens: int = 0, ignore_eos: bool = False
) -> ShapedText:
    """A value following the structure, as token pieces; `max_tokens` cuts it mid-value ("length").

    A forced length (`min_tokens`, `ignore_eos`) is met with whitespace after the value, which a
    JSON grammar allows, so a replay's exact lengths hold for JSON requests too.
    """
    tool_name = ""
    schema = structure.schema
    if structure.kind == TOOL_CALL:
        tool_name, schema = rng.choice(structure.tools)
    value = _value(schema, rng, 0) if schema is not None else {"answer": _words(rng)}
    pieces = _PIECES.findall(orjson.dumps(value).decode())
    target = max_tokens if ignore_eos else min(max(min_tokens - 1, len(pieces)), max_tokens)
    pieces += [" "] * (target - len(pieces))
    if len(pieces) >= max_tokens:
        return ShapedText(tuple(pieces[:max_tokens]), tool_name, "length")
    pieces.append("")  # the EOS token: generated and counted, no text
    return ShapedText(tuple(pieces), tool_name, "tool_calls" if tool_name else "stop")


def _value(schema: Any, rng: random.Random, depth: int) -> Any:
    """A value valid for the common subset of JSON Schema (type, properties, items, enum, const)."""
    if not isinstance(schema, dict):
        return _words(rng)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return _value(schema[key][0], rng, depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties")
        if not isinstance(properties, dict) or depth >= _MAX_DEPTH:
            return {} if properties is not None or depth >= _MAX_DEPTH else {"answer": _words(rng)}
        return {name: _value(sub, rng, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        low = int(schema.get("minItems", 1))
        high = max(low, min(int(schema.get("maxItems", 3)), 3))
        return [_value(schema.get("items"), rng, depth + 1) for _ in range(rng.randint(low, high))]
    if kind == "integer":
        return rng.randint(int(schema.get("minimum", 0)), int(schema.get("maximum", 100)))
    if kind == "number":
        return round(rng.uniform(float(schema.get("minimum", 0)), float(schema.get("maximum", 100))), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _words(rng)


def _words(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(1, 4)))
