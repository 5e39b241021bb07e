"""Prompt files: JSON lines of OpenAI chat or completion request bodies, checked line by line.

Each line is a request body (`messages` or `prompt`, and `tools`, `response_format`, `stop`, ...)
plus two fields of the check's own: `id` (names the prompt in reports) and `reference` (an
expected answer). A bad line fails the whole file with its file name and line number, before
anything is sent. A response schema resolves only `$ref`s inside itself: the check fetches nothing
it was not pointed at (jsonschema would otherwise retrieve a remote `$ref` over the network).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import referencing.jsonschema
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable

from replayproxy.errors import BadInputFile

CHAT = "chat"
COMPLETION = "completion"
# Fields the check sets itself (pinned sampling) or that would hide what it measures: a forced
# length (ignore_eos, min_tokens) hides stop handling; several choices or a stream change nothing.
PINNED_FIELDS = ("temperature", "seed", "ignore_eos", "min_tokens", "stream", "stream_options", "model")
_OWN_FIELDS = ("id", "reference")
_FORMATS = ("text", "json_object", "json_schema")


class PromptFileError(BadInputFile):
    """A prompt file that cannot be used, with the file and line to fix."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One evaluation request, validated; `body` lacks the pinned fields and the check's own."""

    index: int
    id: str
    endpoint: str  # CHAT or COMPLETION
    body: dict[str, Any]
    reference: str | None = None
    structure: str = ""  # "", "json_object", "json_schema" or "tools"
    schema: dict[str, Any] | None = None  # response_format's json_schema.schema
    tool_names: tuple[str, ...] = ()
    messages: int = 0
    has_stop: bool = False
    max_tokens: int | None = None  # the line's own max_tokens, else the check's


@dataclass(frozen=True, slots=True)
class PromptSet:
    source: str  # the file's path, or "builtin"
    digest: str  # sha256 of the file's bytes (of the canonical JSON for the built-in set)
    prompts: tuple[Prompt, ...]


def read_prompts(path: str | Path) -> PromptSet:
    """Read and validate a prompt file; raises PromptFileError naming the file and line."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise PromptFileError(f"{path}: cannot read the prompt file ({e.strerror or e})") from e
    lines = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            lines.append((number, orjson.loads(line)))
        except orjson.JSONDecodeError as e:
            raise PromptFileError(f"{path}:{number}: not a JSON object ({e})") from e
    return PromptSet(str(path), hashlib.sha256(raw).hexdigest(), parse_prompts(str(path), lines))


def parse_prompts(source: str, lines: Iterable[tuple[int, Any]]) -> tuple[Prompt, ...]:
    """Prompts from (line number, decoded JSON) pairs; `source` names them in errors."""
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for number, value in lines:
        prompt = _prompt(f"{source}:{number}", len(prompts), number, value)
        if prompt.id in seen:
            raise PromptFileError(f"{source}:{number}: id {prompt.id!r} repeats line {seen[prompt.id]}")
        seen[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise PromptFileError(f"{source}: no prompts (expected one JSON object per line)")
    return tuple(prompts)


def _prompt(where: str, index: int, number: int, value: Any) -> Prompt:
    if not isinstance(value, dict):
        raise PromptFileError(f"{where}: expected a JSON object (a request body), got {type(value).__name__}")
    if ("messages" in value) == ("prompt" in value):
        raise PromptFileError(f"{where}: needs exactly one of `messages` (chat) or `prompt` (completion)")
    endpoint = CHAT if "messages" in value else COMPLETION
    messages = _messages(where, value["messages"]) if endpoint == CHAT else _completion_prompt(where, value)
    prompt_id = value.get("id", number)
    if isinstance(prompt_id, bool) or not isinstance(prompt_id, str | int) or prompt_id == "":
        raise PromptFileError(f"{where}: `id` must be a non-empty string or an integer")
    reference = value.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise PromptFileError(f"{where}: `reference` must be a string (the expected answer)")
    has_stop = _check_stop(where, value.get("stop"))
    max_tokens = value.get("max_tokens", value.get("max_completion_tokens"))
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise PromptFileError(f"{where}: `max_tokens` must be a positive integer")
    if value.get("n", 1) != 1:
        raise PromptFileError(f"{where}: `n` must be 1 (each repeat is its own request)")
    structure, schema = _response_format(where, value.get("response_format"))
    tool_names = _tools(where, value.get("tools")) if value.get("tool_choice") != "none" else ()
    if tool_names:
        structure = "tools"
    body = {k: v for k, v in value.items() if k not in PINNED_FIELDS + _OWN_FIELDS}
    body.pop("max_completion_tokens", None)
    body.pop("max_tokens", None)
    return Prompt(
        index,
        str(prompt_id),
        endpoint,
        body,
        reference,
        structure,
        schema,
        tool_names,
        messages,
        has_stop,
        max_tokens,
    )


def _messages(where: str, messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise PromptFileError(f"{where}: `messages` must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise PromptFileError(f"{where}: messages[{i}] must be an object with a string `role`")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise PromptFileError(f"{where}: messages[{i}].content must be a string, a list of parts or null")
    return len(messages)


def _completion_prompt(where: str, value: dict[str, Any]) -> int:
    if not isinstance(value["prompt"], str) or not value["prompt"]:
        raise PromptFileError(f"{where}: `prompt` must be a non-empty string")
    if "tools" in value or "response_format" in value:
        raise PromptFileError(f"{where}: `tools` and `response_format` need a chat request (`messages`)")
    return 0


def _check_stop(where: str, stop: Any) -> bool:
    if stop is None:
        return False
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise PromptFileError(f"{where}: `stop` must be a non-empty string or a list of them")
    return bool(stops)


def _response_format(where: str, fmt: Any) -> tuple[str, dict[str, Any] | None]:
    if fmt is None:
        return "", None
    if not isinstance(fmt, dict) or fmt.get("type") not in _FORMATS:
        raise PromptFileError(f"{where}: `response_format.type` must be one of {', '.join(_FORMATS)}")
    if fmt["type"] == "text":
        return "", None
    if fmt["type"] == "json_object":
        return "json_object", None
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise PromptFileError(f"{where}: `response_format.json_schema.schema` must be a JSON schema object")
    dialect = schema.get("$schema")
    known = jsonschema.validators.validator_for(schema, default=None) if isinstance(dialect, str) else None
    if dialect is not None and known is None:
        raise PromptFileError(
            f"{where}: `response_format.json_schema.schema` names an unknown `$schema` {str(dialect)[:100]!r}"
        )
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise PromptFileError(
            f"{where}: `response_format.json_schema.schema` is not a valid schema ({e.message})"
        ) from e
    except RecursionError as e:
        raise PromptFileError(f"{where}: `response_format.json_schema.schema` is nested too deeply") from e
    outside = _outside_ref(schema)
    if outside is not None:
        raise PromptFileError(
            f"{where}: `response_format.json_schema.schema` refers to {outside[:100]!r}, outside the schema "
            "(only local `$ref`s are resolved; nothing is fetched)"
        )
    return "json_schema", schema


def validator(schema: dict[str, Any]) -> Any:
    """A validator for the schema that resolves only references inside it (an empty registry)."""
    return jsonschema.validators.validator_for(schema)(schema, registry=Registry())


def _outside_ref(schema: dict[str, Any]) -> str | None:
    """The first `$ref` that does not resolve within the schema itself (each subschema's `$id`
    setting the base its references resolve against), or None."""
    root = Resource.from_contents(schema, default_specification=referencing.jsonschema.DRAFT202012)
    stack = [(root, Registry().resolver_with_root(root))]
    while stack:
        resource, resolver = stack.pop()
        contents = resource.contents
        for key in ("$ref", "$dynamicRef"):
            ref = contents.get(key) if isinstance(contents, dict) else None
            if isinstance(ref, str):
                try:
                    resolver.lookup(ref)
                except Unresolvable:
                    return ref
        stack += [(sub, resolver.in_subresource(sub)) for sub in resource.subresources()]
    return None


def _tools(where: str, tools: Any) -> tuple[str, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list) or not tools:
        raise PromptFileError(f"{where}: `tools` must be a non-empty list")
    names = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise PromptFileError(
                f'{where}: tools[{i}] must be {{"type": "function", "function": {{"name": ...}}}}'
            )
        names.append(name)
    return tuple(names)
