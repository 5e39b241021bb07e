"""Prompt files: what a line may say, and one clear error naming the file and line when it may not."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from replayproxy.check.builtin import BUILTIN, builtin_prompts
from replayproxy.check.prompts import COMPLETION, PromptFileError, read_prompts, validator

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def write(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join(line if isinstance(line, bytes) else orjson.dumps(line) for line in lines))
    return path


def test_a_line_becomes_a_prompt_without_pinned_fields(tmp_path: Path) -> None:
    line = {
        **CHAT,
        "id": "q1",
        "reference": "hello",
        "temperature": 0.7,
        "seed": 3,
        "ignore_eos": True,
        "min_tokens": 5,
        "stream": True,
        "model": "x",
        "max_tokens": 9,
        "stop": "\n",
        "top_p": 0.9,
    }
    (prompt,) = read_prompts(write(tmp_path, line)).prompts
    assert prompt.id == "q1" and prompt.reference == "hello" and prompt.max_tokens == 9 and prompt.has_stop
    assert prompt.body == {"messages": CHAT["messages"], "stop": "\n", "top_p": 0.9}
    assert prompt.messages == 1 and prompt.structure == ""


def test_ids_default_to_line_numbers_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    prompts = read_prompts(write(tmp_path, CHAT, b"", {"prompt": "Once"})).prompts
    assert [p.id for p in prompts] == ["1", "3"] and [p.index for p in prompts] == [0, 1]
    assert prompts[1].endpoint == COMPLETION and prompts[1].messages == 0


def test_structure_is_recognised(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    tool = {"type": "function", "function": {"name": "f"}}
    lines = [
        {**CHAT, "response_format": {"type": "json_object"}},
        {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}},
        {**CHAT, "tools": [tool]},
        {**CHAT, "tools": [tool], "tool_choice": "none"},
        {**CHAT, "response_format": {"type": "text"}},
    ]
    prompts = read_prompts(write(tmp_path, *lines)).prompts
    assert [p.structure for p in prompts] == ["json_object", "json_schema", "tools", "", ""]
    assert prompts[1].schema == schema and prompts[2].tool_names == ("f",)


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        ([b"[1, 2]"], "p.jsonl:1: expected a JSON object"),
        ([CHAT, b"{oops"], "p.jsonl:2: not a JSON object"),
        ([{"messages": "hi"}], "p.jsonl:1: `messages` must be a non-empty list"),
        ([{"messages": [{"content": "x"}]}], "p.jsonl:1: messages[0] must be an object with a string `role`"),
        ([{"messages": [{"role": "user", "content": 5}]}], "messages[0].content must be a string"),
        ([{"prompt": ""}], "p.jsonl:1: `prompt` must be a non-empty string"),
        ([{"prompt": "x", "tools": []}], "need a chat request"),
        ([{"foo": 1}], "needs exactly one of `messages` (chat) or `prompt` (completion)"),
        ([{**CHAT, "id": "a"}, {**CHAT, "id": "a"}], "p.jsonl:2: id 'a' repeats line 1"),
        ([{**CHAT, "id": True}], "`id` must be a non-empty string or an integer"),
        ([{**CHAT, "reference": 3}], "`reference` must be a string"),
        ([{**CHAT, "stop": [""]}], "`stop` must be a non-empty string or a list of them"),
        ([{**CHAT, "max_tokens": 0}], "`max_tokens` must be a positive integer"),
        ([{**CHAT, "n": 2}], "`n` must be 1"),
        ([{**CHAT, "response_format": {"type": "yaml"}}], "`response_format.type` must be one of"),
        ([{**CHAT, "response_format": {"type": "json_schema"}}], "json_schema.schema` must be a JSON schema"),
        (
            [{**CHAT, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}}],
            "is not a valid schema",
        ),
        ([{**CHAT, "tools": [{"type": "function"}]}], "p.jsonl:1: tools[0] must be"),
        ([b"", b"  "], "p.jsonl: no prompts"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path: Path, lines: list[object], error: str) -> None:
    with pytest.raises(PromptFileError) as caught:
        read_prompts(write(tmp_path, *lines))
    assert error in str(caught.value) and "\n" not in str(caught.value)


def test_missing_file_is_a_prompt_file_error(tmp_path: Path) -> None:
    with pytest.raises(PromptFileError, match="cannot read the prompt file"):
        read_prompts(tmp_path / "absent.jsonl")


def test_builtin_set_covers_every_finding() -> None:
    prompts = builtin_prompts()
    assert len(prompts.prompts) == len(BUILTIN) and prompts.source == "builtin" and len(prompts.digest) == 64
    structures = {p.structure for p in prompts.prompts}
    assert structures == {"", "json_object", "json_schema", "tools"}
    assert any(p.has_stop for p in prompts.prompts) and any(p.reference for p in prompts.prompts)
    assert any(p.endpoint == COMPLETION for p in prompts.prompts)
    assert builtin_prompts().digest == prompts.digest


def _schema_line(schema: dict[str, object]) -> dict[str, object]:
    return {
        **CHAT,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }


def test_local_references_resolve_and_validate_without_a_registry(tmp_path: Path) -> None:
    schema = {
        "$id": "https://example.com/root.json",
        "$defs": {"city": {"type": "string"}, "nested": {"$id": "nested.json", "type": "integer"}},
        "properties": {"city": {"$ref": "#/$defs/city"}, "days": {"$ref": "nested.json"}},
    }
    (prompt,) = read_prompts(write(tmp_path, _schema_line(schema))).prompts
    assert prompt.schema is not None
    check = validator(prompt.schema)
    assert check.is_valid({"city": "Lima", "days": 3}) and not check.is_valid({"city": 1})


@pytest.mark.parametrize(
    ("schema", "error"),
    [
        (
            {"properties": {"a": {"$ref": "http://127.0.0.1:9/s.json"}}},
            "refers to 'http://127.0.0.1:9/s.json'",
        ),
        ({"$ref": "other.json#/x"}, "refers to 'other.json#/x', outside the schema"),
        ({"$ref": "#/$defs/missing"}, "refers to '#/$defs/missing'"),
        ({"$schema": "http://127.0.0.1:9/meta"}, "unknown `$schema` 'http://127.0.0.1:9/meta'"),
        ({"$schema": 5}, "unknown `$schema` '5'"),
    ],
)
def test_a_reference_outside_the_schema_is_refused(
    tmp_path: Path, schema: dict[str, object], error: str
) -> None:
    with pytest.raises(PromptFileError) as refused:
        read_prompts(write(tmp_path, CHAT, _schema_line(schema)))
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'p.jsonl'}:2: `response_format.json_schema.schema` ")
    assert error in message and "\n" not in message


def test_a_deeply_nested_schema_is_one_line(tmp_path: Path) -> None:
    schema = b'{"properties": {"a": ' * 450 + b'{"type": "string"}' + b"}}" * 450
    line = b'{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", '
    with pytest.raises(PromptFileError, match="nested too deeply"):
        read_prompts(write(tmp_path, line + b'"json_schema": {"name": "s", "schema": ' + schema + b"}}}"))
