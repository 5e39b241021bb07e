"""Which served model a recorded model name is sent to."""

from __future__ import annotations

import pytest

from replayproxy.replay.calibrate import probe_failure
from replayproxy.replay.models import choose, served_models

ONE = {"object": "list", "data": [{"id": "llama", "object": "model"}]}
TWO = {"data": [{"id": "llama"}, {"id": "qwen"}]}


def test_served_models_reads_the_openai_list_and_nothing_else() -> None:
    assert served_models(TWO) == ["llama", "qwen"]
    assert served_models(None) == served_models({"data": "x"}) == served_models([1]) == []


def test_names_the_target_serves_are_kept() -> None:
    assert choose({"llama"}, "", {}, served_models(ONE)) == ({}, "")
    assert choose({"prod"}, "", {"prod": "qwen"}, served_models(TWO)) == ({"prod": "qwen"}, "")


def test_the_only_served_model_replaces_an_unknown_name_with_a_note() -> None:
    choice = choose({"synth", "llama"}, "", {}, served_models(ONE))
    assert choice.model_map == {"synth": "llama"}
    assert choice.note.startswith("the trace's model 'synth' is not served; using 'llama'")


def test_several_served_models_and_an_unknown_name_list_them_and_say_model() -> None:
    with pytest.raises(
        ValueError, match=r"'synth' is not served .* serves: llama, qwen; choose one with --model"
    ):
        choose({"synth"}, "", {}, served_models(TWO))


def test_an_explicit_model_must_be_served_unless_the_target_lists_nothing() -> None:
    assert choose({"synth"}, "qwen", {}, served_models(TWO)) == ({}, "")
    assert choose({"synth"}, "anything", {}, []) == ({}, "")
    with pytest.raises(ValueError, match="--model 'gpt' is not served by the target; it serves: llama"):
        choose({"synth"}, "gpt", {}, served_models(ONE))


@pytest.mark.parametrize(
    ("status", "body", "cause"),
    [
        (
            404,
            b'{"message":"The model `synth` does not exist."}',
            "does not serve model 'synth'",
        ),
        (404, b"Not Found", "has no /v1/chat/completions: --target must be the server's base URL"),
        (
            401,
            b'{"error":"Unauthorized"}',
            "give its API key (--api-key, $REPLAYPROXY_API_KEY or $OPENAI_API_KEY)",
        ),
        (200, b'{"choices":[]}', "no usage.prompt_tokens; --no-calibrate skips calibration"),
    ],
)
def test_a_failed_probe_names_its_likely_cause(status: int, body: bytes, cause: str) -> None:
    text = probe_failure(status, body, "/v1/chat/completions", "synth")
    assert cause in text and body.decode() in text
