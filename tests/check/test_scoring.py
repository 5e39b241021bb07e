"""One answer scored: keyed hashes, rapidfuzz similarity, JSON / schema / tool-call validity, references."""

from __future__ import annotations

from typing import Any

from replayproxy.check.client import Answer, ToolCall
from replayproxy.check.prompts import Prompt
from replayproxy.check.scoring import (
    NOT_APPLICABLE,
    PPM,
    Hasher,
    comparable_text,
    json_checks,
    reference_checks,
    similarity_ppm,
    tool_check,
)

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def prompt(**fields: Any) -> Prompt:
    return Prompt(0, "p", "chat", {"messages": []}, **fields)


def test_hashes_are_keyed_and_cover_tool_calls() -> None:
    a, b = Hasher(b"k" * 32), Hasher(b"j" * 32)
    answer = Answer(text="yes")
    assert a(answer) == a(Answer(text="yes")) and a(answer) != b(answer) and len(a(answer)) == 16
    called = Answer(text="yes", tool_calls=(ToolCall("f", "{}"),))
    assert a(called) != a(answer) and comparable_text(called) == "yes\nf({})"


def test_similarity_is_normalized_indel() -> None:
    assert similarity_ppm("abc", "abc") == PPM and similarity_ppm("", "") == PPM
    assert similarity_ppm("abcd", "abce") == 750_000  # 2 edits over 8 characters
    assert similarity_ppm("aaaa", "bbbb") == 0


def test_json_checks() -> None:
    assert json_checks(prompt(), Answer(text="{}")) == (NOT_APPLICABLE, NOT_APPLICABLE)
    obj = prompt(structure="json_object")
    assert json_checks(obj, Answer(text='{"a": 1}')) == (1, NOT_APPLICABLE)
    assert json_checks(obj, Answer(text="[1]")) == (0, NOT_APPLICABLE)  # json_object asks for an object
    assert json_checks(obj, Answer(text="{")) == (0, NOT_APPLICABLE)
    schema = prompt(structure="json_schema", schema=SCHEMA)
    assert json_checks(schema, Answer(text='{"n": 3}')) == (1, 1)
    assert json_checks(schema, Answer(text='{"n": "3"}')) == (1, 0)
    assert json_checks(schema, Answer(text='{"n": 3')) == (0, 0)


def test_tool_check() -> None:
    tools = prompt(structure="tools", tool_names=("f", "g"))
    assert tool_check(prompt(), Answer()) == NOT_APPLICABLE
    assert tool_check(tools, Answer(tool_calls=(ToolCall("g", '{"x": 1}'),))) == 1
    assert tool_check(tools, Answer(tool_calls=(ToolCall("h", "{}"),))) == 0  # not declared
    assert tool_check(tools, Answer(tool_calls=(ToolCall("f", "{x"),))) == 0  # arguments do not parse
    assert tool_check(tools, Answer(tool_calls=(ToolCall("f", "[]"),))) == 0  # arguments not an object
    assert tool_check(tools, Answer(text="I cannot")) == NOT_APPLICABLE  # "auto" allows a plain answer
    forced = Prompt(
        0, "p", "chat", {"messages": [], "tool_choice": "required"}, structure="tools", tool_names=("f",)
    )
    assert tool_check(forced, Answer(text="I cannot")) == 0


def test_reference_checks() -> None:
    assert reference_checks(prompt(), Answer(text="x")) == (NOT_APPLICABLE, -1)
    assert reference_checks(prompt(reference="Paris"), Answer(text=" Paris\n")) == (1, PPM)
    exact, similar = reference_checks(prompt(reference="Paris"), Answer(text="Paris."))
    assert exact == 0 and 0 < similar < PPM
