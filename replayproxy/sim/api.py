"""Request validation for the OpenAI endpoints: JSON bytes in, a `GenRequest` or an `ApiError` out.

Mirrors what vLLM's OpenAI server accepts for the fields clients use; unknown fields are ignored,
and invalid values answer 400 with vLLM's error object. No I/O here, so every rule is unit-tested.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from replayproxy.sim.prompts import Prompts, WordPrompts
from replayproxy.sim.sampler import SamplingParams
from replayproxy.sim.structured import Structure, StructureError, parse_structure

CHAT = "chat"
COMPLETION = "completion"


class ApiError(Exception):
    """An error answer; `body()` is vLLM's `{"error": {message, type, param, code}}` object."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "BadRequestError"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        return orjson.dumps({"error": error})


@dataclass(frozen=True, slots=True)
class GenRequest:
    """A validated generation request."""

    endpoint: str  # CHAT or COMPLETION
    prompt_ids: list[int]
    sampling: SamplingParams
    stream: bool
    include_usage: bool
    continuous_usage: bool
    messages: int = 0  # chat messages rendered into the prompt (0 for completions)
    structure: Structure | None = None  # JSON or a tool call asked for (chat only)
    return_token_ids: bool = False  # vLLM's `return_token_ids`: each choice carries its token ids


ECHOED_BYTES = 200


def echoed_rejection(raw: bytes) -> ApiError:
    """A 400 whose message quotes the start of the request, as many engines' validators do."""
    return ApiError(400, f"Invalid request: {raw[:ECHOED_BYTES].decode('utf-8', 'replace')}")


_WORDS = WordPrompts()


def json_body(raw: bytes, model: str) -> dict[str, Any]:
    """The request's JSON object, for this model; raises ApiError (400, or 404 for another model)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"Invalid JSON body: {e}") from e
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object")
    requested = body.get("model")
    if requested is not None and requested != model:
        raise ApiError(404, f"The model `{requested}` does not exist.", "model", "NotFoundError")
    return body


def parse(endpoint: str, raw: bytes, model: str, max_model_len: int, prompts: Prompts = _WORDS) -> GenRequest:
    """Validate one request body for `endpoint`; raises ApiError (400, or 404 for another model)."""
    body = json_body(raw, model)
    prompt_ids = chat_prompt(body, prompts) if endpoint == CHAT else _completion_prompt(body, prompts)
    if _integer(body, "n", 1) != 1:
        raise ApiError(400, "n > 1 is not supported by the simulated engine", "n")
    stream = _boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    if options is not None and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    options = options or {}
    include_usage = _boolean(options, "include_usage", False)
    return GenRequest(
        endpoint=endpoint,
        prompt_ids=prompt_ids,
        sampling=_sampling(body, len(prompt_ids), max_model_len),
        stream=stream,
        include_usage=include_usage,
        # As in vLLM, per-chunk usage is sent only when usage was asked for at all.
        continuous_usage=include_usage and _boolean(options, "continuous_usage_stats", False),
        messages=len(body["messages"]) if endpoint == CHAT else 0,
        structure=_structure(body) if endpoint == CHAT else None,
        return_token_ids=_boolean(body, "return_token_ids", False),
    )


def _structure(body: dict[str, Any]) -> Structure | None:
    try:
        return parse_structure(body)
    except StructureError as e:
        raise ApiError(400, str(e), e.param) from e


def _sampling(body: dict[str, Any], prompt_len: int, max_model_len: int) -> SamplingParams:
    max_tokens = _integer(body, "max_completion_tokens", None)
    param = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, param = _integer(body, "max_tokens", None), "max_tokens"
    if prompt_len >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_len} input tokens. Please reduce the length of the input.",
        )
    if max_tokens is None:
        max_tokens = max_model_len - prompt_len
    elif max_tokens < 1:
        raise ApiError(400, f"{param} must be at least 1, got {max_tokens}.", param)
    elif prompt_len + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            param,
        )
    min_tokens = _integer(body, "min_tokens", 0)
    if not 0 <= min_tokens <= max_tokens:
        raise ApiError(
            400, f"min_tokens must be between 0 and max_tokens={max_tokens}, got {min_tokens}.", "min_tokens"
        )
    temperature = body.get("temperature")
    if temperature is None:
        temperature = 1.0
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
        raise ApiError(400, f"temperature must be a non-negative number, got {temperature!r}.", "temperature")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is None:
        stop = []
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "stop must be a non-empty string or a list of them", "stop")
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_boolean(body, "ignore_eos", False),
        temperature=float(temperature),
        seed=_integer(body, "seed", None),
        stop=tuple(stop),
    )


def tokenize(raw: bytes, model: str, prompts: Prompts) -> list[int]:
    """vLLM's `POST /tokenize`: `messages` with the chat template and generation prompt, or `prompt`."""
    body = json_body(raw, model)
    if "messages" in body:
        return chat_prompt(body, prompts)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise ApiError(400, "prompt must be a string, or give messages", "prompt")
    return prompts.text(prompt, _boolean(body, "add_special_tokens", True))


def chat_prompt(body: dict[str, Any], prompts: Prompts) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    rendered = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ApiError(400, f"messages[{i}] must be an object", "messages")
        role = message.get("role")
        if role not in prompts.roles:
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(prompts.roles)}", "messages")
        rendered.append((role, _content_text(message.get("content"), i)))
    return prompts.chat(rendered)


def _content_text(content: Any, i: int) -> str:
    """A message's text: a string, null, or a list of {"type": "text", "text": ...} parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
            return "\n".join(texts)  # type: ignore[arg-type]
    raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", "messages")


def _completion_prompt(body: dict[str, Any], prompts: Prompts) -> list[int]:
    """`prompt` as a string, token ids, or a one-element list of either (the sim serves no batches)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise ApiError(
                400, "a batch of several prompts is not supported by the simulated engine", "prompt"
            )
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompts.text(prompt)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        outside = next((t for t in prompt if not 0 <= t < prompts.vocab_size), None)
        if outside is not None:  # vLLM's wording
            raise ApiError(400, f"Token id {outside} is out of vocabulary", "prompt")
        return prompt
    raise ApiError(
        400,
        "prompt must be a non-empty string, a list of token ids, or a one-element list of either",
        "prompt",
    )


def _integer(body: dict[str, Any], name: str, default: int | None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer, got {value!r}", name)
    return value


def _boolean(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be a boolean, got {value!r}", name)
    return value
