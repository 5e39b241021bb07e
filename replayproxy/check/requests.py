"""Request bodies with pinned sampling, in each engine's dialect.

Every target gets the same body for a prompt: temperature 0, one fixed `seed`, the same
`max_tokens`, never `ignore_eos` or `min_tokens` (a forced length hides stop handling), no stream.
Only the model name and the engine's spelling of structured output differ. vLLM, SGLang,
TensorRT-LLM, llama.cpp's server and OpenAI take OpenAI's `response_format` (`json_schema` with
`{"name", "schema"}`) and `seed`; TGI's Messages API takes `seed` and a JSON grammar as
`{"type": "json_object", "value": SCHEMA}` (TGI's guidance docs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replayproxy.check.prompts import CHAT, Prompt
from replayproxy.results import PinnedSampling

PATHS = {CHAT: "/v1/chat/completions", "completion": "/v1/completions"}
DEFAULT_SEED = 1234
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Sampling:
    """The sampling every target gets; `seed` goes to engines that take one (all the above do)."""

    seed: int = DEFAULT_SEED
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0

    def to_record(self) -> PinnedSampling:
        return PinnedSampling(
            temperature=self.temperature,
            seed=self.seed,
            max_tokens=self.max_tokens,
            ignore_eos=False,
            stream=False,
        )


def request_body(prompt: Prompt, sampling: Sampling, model: str, flavor: str) -> dict[str, Any]:
    """The JSON body for one prompt at one target; key order fixed so bodies are reproducible."""
    body: dict[str, Any] = {"model": model} if model else {}
    body.update(prompt.body)
    body["max_tokens"] = prompt.max_tokens or sampling.max_tokens
    body["temperature"] = sampling.temperature
    body["seed"] = sampling.seed
    body["stream"] = False
    if flavor == "tgi" and prompt.schema is not None:
        body["response_format"] = {"type": "json_object", "value": prompt.schema}
    return body
